"""Every subcommand's flags say what they do, and the commands that analyse take the same
model and load flags."""

from __future__ import annotations

import argparse

from sptrace.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_format_flag_has_help():
    for name, p in _subcommands().items():
        for action in p._actions:
            if "--format" in action.option_strings:
                assert action.help, f"sptrace {name} --format has no help"


def test_the_analysing_commands_take_the_same_model_and_load_flags():
    commands = _subcommands()
    flags = {name: {s for a in commands[name]._actions for s in a.option_strings}
             for name in ("check", "analyze", "report", "dash")}  # fmt: skip
    shared = {"--config", "--batch", "--seq", "--hidden", "--sp", "--heads", "--ffn", "--dtype", "--no-cache",
              "--cache-dir", "--skip-bad", "--workers"}  # fmt: skip
    for name, have in flags.items():
        assert shared <= have, (name, sorted(shared - have))
