"""Generated docs match the code: docs/cli.md (the argparse parser) and the README's client
snippets (gateway/cli/clientconfig.py, which `pvegate demo` also prints)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from gateway.cli import build_parser, clientconfig
from gateway.cli import docs as docgen
from gateway.sim.cli import build_parser as sim_parser


def _parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [p]
    for _, _, sub in docgen._subcommands(p):
        out += _parsers(sub)
    return out


def test_committed_docs_match_the_generator() -> None:
    for path, text in docgen.generated().items():
        assert path.read_text() == text, (
            f"{path.relative_to(docgen.ROOT)} has drifted from the code: "
            "regenerate it with `.venv/bin/python -m gateway.cli.docs` and commit the result"
        )


def test_every_option_has_help() -> None:
    missing = []
    for parser in [*_parsers(build_parser()), sim_parser()]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.help:
                missing.append(f"{parser.prog}: {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "options without help=: " + ", ".join(missing)


def test_every_command_is_in_the_reference() -> None:
    doc = docgen.CLI_DOC.read_text()
    for parser in _parsers(build_parser())[1:]:
        assert f"## `{parser.prog}`" in doc, parser.prog


def test_readme_snippets_are_the_clients_documented_shapes() -> None:
    section = docgen.README.read_text().split(docgen.CLIENTS_BEGIN, 1)[1].split(docgen.CLIENTS_END, 1)[0]
    blocks = re.findall(r"```(json|sh)\n(.*?)\n```", section, re.S)
    docs = [json.loads(text) for lang, text in blocks if lang == "json"]
    url, token = clientconfig.README_URL, f"Bearer {clientconfig.README_TOKEN}"
    claude, vscode, cursor = docs
    assert claude["mcpServers"]["pvegate"] == {"type": "http", "url": url, "headers": {"Authorization": token}}
    assert vscode["servers"]["pvegate"] == {"type": "http", "url": url, "headers": {"Authorization": token}}
    assert cursor["mcpServers"]["pvegate"] == {"url": url, "headers": {"Authorization": token}}
    commands = [text for lang, text in blocks if lang == "sh"]
    assert commands[0].startswith(f"claude mcp add --transport http pvegate {url} --header ")
    assert "--cli " + url + " --transport http --header " in commands[1]


def test_check_mode_names_a_stale_file_and_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert docgen.main(["--check"]) == 0
    stale = tmp_path / "cli.md"
    stale.write_text("# an old reference\n")
    monkeypatch.setattr(docgen, "CLI_DOC", stale)
    monkeypatch.setattr(docgen, "ROOT", tmp_path)
    assert docgen.main(["--check"]) == 1
    assert "cli.md is out of date with the code: run `python -m gateway.cli.docs`" in capsys.readouterr().err
    assert stale.read_text() == "# an old reference\n"  # --check never writes


def test_every_environment_variable_is_in_the_deployment_table() -> None:
    """Each PVEGATE_* variable the code reads has a row in docs/deployment.md's table."""
    names: set[str] = set()
    for path in [*(docgen.ROOT / "gateway").rglob("*.py"), *(docgen.ROOT / "docker").rglob("*.py")]:
        names |= set(re.findall(r"\bPVEGATE_[A-Z_]+[A-Z]\b", path.read_text()))
    assert names, "no PVEGATE_ variables found: the scan is broken"
    table = (docgen.ROOT / "docs" / "deployment.md").read_text()
    missing = sorted(n for n in names if f"| `{n}` |" not in table)
    assert not missing, f"docs/deployment.md's environment table lacks: {', '.join(missing)}"
