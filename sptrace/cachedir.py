"""Where sptrace's caches live, how large they may grow, the digest of the code that fills them,
and how their entries are kept (Store: where an entry lives for a key, read, atomic write, list,
prune to a byte budget, clear), shared by the three caches: parsed tables and per-rank summaries
(sptrace.load.cache, sptrace.run.summaries) and replayed results (sptrace.cli.result_cache).
Standard library only: a replayed result is found and printed before pandas or pyarrow is
imported."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypedDict, TypeVar

from sptrace.vocab.errors import UsageError

DEFAULT_MAX_BYTES = 2 * 2**30
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_LIBRARIES = ("numpy", "pandas", "pyarrow")
_SOURCES = ("*.py", "*.c")
"""What the package's behaviour is written in: Python, and the C of the native decoder (the
built extension follows its source)."""


def trace_prefix(path: Path) -> str:
    """The name prefix of every entry made from the trace at ``path``: its resolved path's digest."""
    return hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:20]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "sptrace"


def max_bytes() -> int:
    """The cap: SPTRACE_CACHE_MAX (bytes, or with a K/M/G/T suffix), else 2 GiB."""
    text = os.environ.get("SPTRACE_CACHE_MAX", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"SPTRACE_CACHE_MAX={text!r}: give bytes, or a size such as 500M or 4G")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


_DIGESTS: dict[tuple[str, frozenset[str]], str | None] = {}


def sources_digest(salt: str, exclude: Collection[str] = ()) -> str | None:
    """A SHA-256 of the package's sources (but the top-level parts in ``exclude``) and of the
    Python, numpy, pandas and pyarrow they run on (the size and mtime of each one's
    ``__init__.py``, located without importing it); None when the sources are not there to read.
    Taken once per process: about 6 ms for the whole package on 2 cores."""
    known = (salt, frozenset(exclude))
    if known not in _DIGESTS:
        _DIGESTS[known] = _digest(salt, known[1])
    return _DIGESTS[known]


def _digest(salt: str, exclude: frozenset[str]) -> str | None:
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256(f"{salt}|{sys.version}".encode())
    sources = sorted(
        p for pattern in _SOURCES for p in root.rglob(pattern) if p.relative_to(root).parts[0] not in exclude
    )  # fmt: skip
    if not sources:
        return None
    try:
        for p in sources:
            digest.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
        for name in _LIBRARIES:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
            st = os.stat(origin) if origin else None
            digest.update(f"{name}|{origin}|{st and st.st_size}|{st and st.st_mtime_ns}".encode())
    except OSError:
        return None
    return digest.hexdigest()


Parsed = TypeVar("Parsed")


class EntryHeader(TypedDict, total=False):
    """What an entry records about itself beside its payload: every kind names its ``source`` (the
    trace or run it was made from, resolved); a summary adds ``about`` (what it holds) and ``code``
    (the digest of the code that wrote it), a result ``command`` and ``exit_code``."""

    source: str
    about: str
    code: str | None
    command: str
    exit_code: int


@dataclass(frozen=True)
class EntryFormat:
    """One kind of entry a store holds: its file name and how its header is read."""

    kind: str
    suffix: str
    name: re.Pattern[str]
    """An entry's whole file name; its ``crc`` group is the CRC-32 of the entry's bytes."""
    read_header: Callable[[Path], EntryHeader]
    """The entry's header; OSError or ValueError when it cannot be read."""


def keyed_answers(kind: str, magic: bytes) -> EntryFormat:
    """The entries of kept answers (results, analyses): named ``slot-version-crc.KIND``, where the
    slot is what was asked and the version what it was asked of (the run's files, the code), each
    a 16-hex digest, and a framed header behind ``magic``."""
    pattern = re.compile(rf"^(?P<slot>[0-9a-f]{{16}})-(?P<version>[0-9a-f]{{16}})-(?P<crc>[0-9a-f]{{8}})\.{kind}$")
    return EntryFormat(kind, f".{kind}", pattern, framed_header(magic))


@dataclass(frozen=True)
class Entry:
    """One entry of a store, as ``sptrace cache info`` lists it."""

    path: Path
    bytes: int
    used: float
    """When it was last read or written (its mtime)."""
    kind: str
    header: EntryHeader = field(compare=False)
    """Empty when the entry cannot be read."""

    @property
    def source(self) -> str | None:
        """What it was made from (None when unreadable)."""
        source = self.header.get("source")
        return source if isinstance(source, str) else None

    @property
    def source_gone(self) -> bool:
        return self.source is None or not Path(self.source).exists()


_HEADERS: dict[tuple[str, int], EntryHeader] = {}
"""(entry path, size) -> its header, read once per process: an entry's bytes never change under
its name (the name carries their CRC), and every write prunes, so a run of many ranks would
otherwise open every entry again for each rank it writes."""
_VERIFIED: dict[tuple[str, int, int], bool] = {}


@dataclass(frozen=True)
class Store:
    """A directory of cache entries of some formats, kept within one byte budget.

    Every entry is written to a temporary file and renamed (no reader sees half of it, and two
    processes writing one entry race harmlessly: the last rename wins, both entries are whole),
    under a name that carries the CRC-32 of its bytes, checked before it is trusted: a damaged or
    truncated entry is a miss, deleted. Past the budget the least recently used entries go, and
    entries whose source is gone are dropped."""

    directory: Path
    formats: tuple[EntryFormat, ...]
    share: int = 1
    """The store may hold ``max_bytes() // share`` bytes."""

    def candidates(self, prefix: str, fmt: EntryFormat) -> list[Path]:
        """The entries of ``fmt`` whose names start with ``prefix``."""
        return sorted(self.directory.glob(f"{prefix}*{fmt.suffix}")) if self.directory.is_dir() else []

    def intact(self, entry: Path, fmt: EntryFormat, *, remember: bool = False) -> bool:
        """Whether the entry's bytes still have the CRC-32 its name carries (read as a stream);
        ``remember``: checked once per process for an unchanged file. OSError when it is gone."""
        if not remember:
            return _crc_matches(entry, fmt)
        st = entry.stat()
        key = (str(entry), st.st_size, st.st_mtime_ns)
        if key not in _VERIFIED:
            _VERIFIED[key] = _crc_matches(entry, fmt)
        return _VERIFIED[key]

    def read(self, prefix: str, fmt: EntryFormat, parse: Callable[[bytes], Parsed]) -> tuple[Path, Parsed] | None:
        """The first entry of ``fmt`` named ``prefix...`` whose bytes are whole and that ``parse``
        accepts (ValueError, KeyError or TypeError: it does not), marked as used now, with what
        ``parse`` made of it; None when there is none. A damaged or unusable entry is deleted."""
        for entry in self.candidates(prefix, fmt):
            try:
                data = entry.read_bytes()
                match = fmt.name.match(entry.name)
                if match is None or zlib.crc32(data) != int(match.group("crc"), 16):
                    raise ValueError("damaged")
                parsed = parse(data)
                os.utime(entry)  # used now: the least recently used entries are evicted first
                return entry, parsed
            except FileNotFoundError:
                continue  # evicted or replaced by another process meanwhile
            except (OSError, ValueError, KeyError, TypeError):
                entry.unlink(missing_ok=True)  # damaged or truncated: never trusted, rebuilt by the caller
        return None

    def put(
        self,
        stem: str,
        fmt: EntryFormat,
        data: bytes | Callable[[BinaryIO], object],
        *,
        replaces: str,
        sharing: str | None = None,
    ) -> Path | None:
        """Write the entry ``{stem}{crc}{suffix}`` atomically (``data``: its bytes, or a function
        that writes them to a file), delete the entries it replaces (those of ``fmt`` named
        ``{replaces}...`` but those named ``{sharing}...``), then keep the store within its
        budget; the entry, or None when the directory is not writable."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=fmt.suffix)
            try:
                with os.fdopen(fd, "wb") as sink:
                    if isinstance(data, bytes):
                        sink.write(data)
                    else:
                        data(sink)
                crc = zlib.crc32(data) if isinstance(data, bytes) else file_crc(Path(tmp))
                entry = self.directory / f"{stem}{crc:08x}{fmt.suffix}"
                os.replace(tmp, entry)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            for stale in self.candidates(replaces, fmt):
                if stale != entry and not (sharing is not None and stale.name.startswith(sharing)):
                    stale.unlink(missing_ok=True)
            self.prune(keep=entry)
            return entry
        except OSError:
            return None

    def entries(self) -> list[Entry]:
        """Every entry of the store's formats, least recently used first."""
        out = []
        for p in self.directory.iterdir() if self.directory.is_dir() else []:
            fmt = next((f for f in self.formats if f.name.match(p.name)), None)
            if fmt is None:
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            header = _HEADERS.get((str(p), st.st_size))
            if header is None:
                try:
                    header = fmt.read_header(p)
                except (OSError, ValueError):
                    header = EntryHeader()
                if isinstance(header.get("source"), str):
                    _HEADERS[(str(p), st.st_size)] = header
            out.append(Entry(p, st.st_size, st.st_mtime, fmt.kind, header))
        return sorted(out, key=lambda e: e.used)

    def prune(self, *, keep: Path | None = None, limit: int | None = None) -> list[Path]:
        """Drop entries whose source is gone, then the least recently used until the store fits
        ``limit`` (default: its budget); ``keep`` (the entry just written) is never dropped."""
        limit = max_bytes() // self.share if limit is None else limit
        removed = []
        alive = []
        for e in self.entries():
            if e.path != keep and e.source_gone:
                e.path.unlink(missing_ok=True)
                removed.append(e.path)
            else:
                alive.append(e)
        total = sum(e.bytes for e in alive)
        for e in alive:
            if total <= limit:
                break
            if e.path == keep:
                continue
            e.path.unlink(missing_ok=True)
            removed.append(e.path)
            total -= e.bytes
        sweep_temporaries(self.directory)
        return removed

    def clear(self) -> int:
        """Delete every entry; the bytes freed."""
        freed = 0
        for e in self.entries():
            freed += e.bytes
            e.path.unlink(missing_ok=True)
        return freed


def file_crc(path: Path) -> int:
    """The CRC-32 of a file's bytes, read as a stream."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _crc_matches(entry: Path, fmt: EntryFormat) -> bool:
    match = fmt.name.match(entry.name)
    return match is not None and file_crc(entry) == int(match.group("crc"), 16)


def frame(magic: bytes, header: EntryHeader, payload: bytes) -> bytes:
    """An entry's bytes: ``magic``, the length of a JSON header (4 bytes, little-endian), the
    header, then the payload."""
    head = json.dumps(header).encode()
    return magic + len(head).to_bytes(4, "little") + head + payload


def unframe(magic: bytes, data: bytes) -> tuple[EntryHeader, int]:
    """(a framed entry's header, where its payload starts); ValueError when it is no such entry."""
    n = len(magic)
    if data[:n] != magic or len(data) < n + 4:
        raise ValueError("not an entry of this kind")
    length = int.from_bytes(data[n : n + 4], "little")
    if len(data) < n + 4 + length:
        raise ValueError("truncated")
    header = json.loads(data[n + 4 : n + 4 + length])  # a JSONDecodeError is a ValueError
    if not isinstance(header, dict):
        raise ValueError("not an entry of this kind")
    return EntryHeader(**header), n + 4 + length


def framed_header(magic: bytes) -> Callable[[Path], EntryHeader]:
    """An EntryFormat's read_header for framed entries: reads the header alone."""

    def read(entry: Path) -> EntryHeader:
        with open(entry, "rb") as f:
            head = f.read(len(magic) + 4)
            length = int.from_bytes(head[len(magic) :], "little")
            header, _ = unframe(magic, head + f.read(length))
        return header

    return read


def sweep_temporaries(directory: Path, max_age_s: float = 3600) -> None:
    """Delete the temporary files a process killed mid-write left, ``max_age_s`` ago or more
    (a younger one may still be being written)."""
    for tmp in directory.glob(".tmp-*"):
        try:
            if time.time() - tmp.stat().st_mtime > max_age_s:
                tmp.unlink(missing_ok=True)
        except FileNotFoundError:
            pass


def run_fingerprint(run: Path) -> list[list[object]]:
    """The name, size, mtime_ns and inode of every entry a run's kept answer can depend on: of
    every entry of its folder (traces, ``run.json``, a file added or removed), or of the trace file
    and the ``run.json`` beside it. OSError when the run cannot be read."""
    files = [run / n for n in sorted(os.listdir(run))] if run.is_dir() else [run, run.parent / "run.json"]
    out: list[list[object]] = [[str(run), os.stat(run).st_mtime_ns]]
    for p in files:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            out.append([p.name, None])
            continue
        out.append([p.name, st.st_size, st.st_mtime_ns, st.st_ino])
    return out
