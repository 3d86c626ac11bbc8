"""Which transformer layer a module is: from its path (``layers.3.mlp``), from the set of paths
a rank's markers name together, or from the python stacks' module frames (``nn.Module:
LlamaDecoderLayer_3``), which name a module by its class and a per-class counter."""

from __future__ import annotations

import re
from collections.abc import Iterable

from sptrace.detect.args import present
from sptrace.detect.intervals import Intervals

_LAYER_IN_PATH = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block|decoder\.layers|encoder\.layers)\.(\d+)(?:\.|$)")
# python stacks name modules "nn.Module: <Class>_<k>" (k counts instances of the class): a class
# whose name ENDS in Layer or Block is a transformer layer (LlamaDecoderLayer, GPT2Block,
# TransformerBlock); LayerNorm_1 or BlockSparseAttention_0 are not
_LAYER_CLASS = re.compile(r"^nn\.Module: (\w*(?:Layer|Block))_(\d+)$")
_CONTAINERS = re.compile(r"^nn\.Module: (?:ModuleList|Sequential)_\d+$")


def layer_of(module: str | None) -> int | None:
    """The layer index of a module path, only inside a layer container (``layers.3.mlp``,
    ``h.3``, ``blocks.3``, ``decoder.layers.3``); None elsewhere."""
    if not module:
        return None
    match = _LAYER_IN_PATH.search(module)
    return int(match.group(1)) if match else None


def layers_of_paths(paths: Iterable[str]) -> dict[str, int]:
    """Module paths -> layer index, read from the paths together: a named layer container first
    (``layer_of``); else the outermost numbered child of a container (a path part that is a
    number: a ModuleList or Sequential index) that holds modules of its own, as ``0`` does in
    ``0.attn`` for ``nn.Sequential(*blocks)``. A Sequential MLP's ``mlp.0`` Linear holds none
    and is no layer (the same rule ``python_layer_frames`` applies to python stacks)."""
    paths = {p for p in paths if p}
    composite = {p.rsplit(".", 1)[0] for p in paths if "." in p}
    composite |= {c.rsplit(".", k)[0] for c in list(composite) for k in range(1, c.count(".") + 1)}
    out: dict[str, int] = {}
    for path in paths:
        n = layer_of(path)
        if n is None:
            parts = path.split(".")
            n = next((int(part) for i, part in enumerate(parts)
                      if part.isdigit() and ".".join(parts[: i + 1]) in composite), None)  # fmt: skip
        if n is not None:
            out[path] = n
    return out


def python_layer_frames(python: Intervals) -> dict[str, int]:
    """The module frames of the python stacks ``python`` that are transformer layers -> layer index.

    Python stacks name modules by class and a per-class counter (``nn.Module: Block_3``), not
    by attribute path, so a layer is recognised by what it is:
      * a class named *Layer or *Block (LlamaDecoderLayer, GPT2Block, TransformerLayer);
      * a child of a Sequential / ModuleList that was called (the container's own frame) and
        holds modules of its own (an MLP's Linear inside a block's Sequential is no layer);
      * one of several instances of a composite module (one with modules inside) called from
        the same parent: the stack of layers a ``for layer in self.layers`` loop runs.
    Its index is the class counter: the k-th instance of the layer class."""
    if not len(python):
        return {}
    ids = python.column("python_id")
    names: dict[int, str] = dict(zip(ids, (python.name(i) for i in range(len(python)))))
    parents: dict[int, object] = dict(zip(ids, python.column("python_parent_id")))

    def module_parent(pid: int) -> int | None:
        parent = parents.get(pid)
        for _ in range(64):
            if parent is None or not present(parent) or parent not in names:
                return None
            if names[parent].startswith("nn.Module: "):
                return parent
            parent = parents.get(parent)
        return None

    modules = [pid for pid, name in names.items() if name.startswith("nn.Module: ")]
    parent_of = {pid: module_parent(pid) for pid in modules}
    composite = {names[p] for p in parent_of.values() if p is not None}
    siblings: dict[int | None, dict[str, set[str]]] = {}
    for pid in modules:
        name = names[pid]
        cls = name[len("nn.Module: ") :].rpartition("_")[0]
        siblings.setdefault(parent_of[pid], {}).setdefault(cls, set()).add(name)
    layers: set[str] = set()
    for pid in modules:
        name = names[pid]
        parent = parent_of[pid]
        if _CONTAINERS.match(name):
            continue
        # a container's child is a layer only if it holds modules of its own: the Linear and
        # GELU of an nn.Sequential MLP inside a block are not layers
        if _LAYER_CLASS.match(name) or (parent is not None and _CONTAINERS.match(names[parent]) and name in composite):
            layers.add(name)
    for group in siblings.values():
        for same in group.values():
            if len(same) >= 2 and all(n in composite and not _CONTAINERS.match(n) for n in same):
                layers |= same
    # a lone layer-like frame that runs a stack of layers is their container, not a layer:
    # Megatron-Core's TransformerBlock_0 around TransformerLayer_0, TransformerLayer_1 (the layer
    # is the innermost repeated one, as the framework numbers it)
    stacks = {
        names[parent] for parent, group in siblings.items() if parent is not None
        for same in group.values() if len(same) >= 2 and same <= layers
    }  # fmt: skip
    lone = {n for group in siblings.values() for same in group.values() if len(same) == 1 for n in same}
    layers -= stacks & lone
    out: dict[str, int] = {}
    for name in layers:
        number = name.rsplit("_", 1)[1]
        if number.isdigit():
            out[name] = int(number)
    return out
