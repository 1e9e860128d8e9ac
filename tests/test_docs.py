"""README and docs/: README stays short, and every relative link points at a file that exists
(and, for a link into a markdown file with #anchor, at a heading of that file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M)}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_readme_is_at_most_300_lines():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; move detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_existing_files(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(REPO)})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in _links(REPO / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages README does not link: {missing}"


# --------------------------------------------------------------------------- the commands the pages show
CODE = re.compile(r"^```[a-z]*\n(.*?)^```|((?:^    .*\n)+)", re.S | re.M)
PLACEHOLDERS = {"HEAD:6379": "127.0.0.1:6379", "runs/*": "runs/x", "/path/to/proteinfold": "/tmp/none"}
QUICK_METHODS = ("hw-cefmc", "digits-kfed")  # closed-form: every such run command runs here


def _commands() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for fenced, indented in CODE.findall(page.read_text()):
            text = (fenced or indented).replace("\\\n", " ")
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("raymvc "):
                    cmd = re.split(r"\s+#\s", line)[0].split(" | ")[0].strip()
                    for k, v in PLACEHOLDERS.items():
                        cmd = cmd.replace(k, v)
                    out.append((str(page.relative_to(REPO)), cmd))
    return out


COMMANDS = _commands()


def _scenario_file(arg: str) -> Path:
    for base in (REPO, REPO / "examples" / "own_method"):
        if (base / arg).is_file():
            return base / arg
    raise AssertionError(f"{arg}: no such file in the repository")


def test_the_pages_show_commands():
    assert len(COMMANDS) >= 40


def _make_data_file(page: str, cmd: str, folder: Path) -> None:
    """A command that reads ``data.path=FILE`` follows the page's own ``python -c`` line that writes FILE: run it."""
    import shlex
    import subprocess
    import sys

    name = re.search(r"data\.path=(\S+)", cmd).group(1)
    for fenced, indented in CODE.findall((REPO / page).read_text()):
        for line in (fenced or indented).replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("python -c") and name in line:
                subprocess.run([sys.executable, *shlex.split(line)[1:]], cwd=folder, check=True)
                return
    raise AssertionError(f"{page}: nothing on the page writes {name}")


@pytest.mark.parametrize("page, cmd", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_every_command_on_the_pages_parses_and_its_scenario_loads(page, cmd, tmp_path, monkeypatch):
    """Every ``raymvc`` command README and docs/ show: the command line parses, every
    scenario or study file it names exists, and its scenario loads with its ``--set`` and
    ``--grid`` values (what would fail first if a reader ran it)."""
    import shlex

    from raymvc.cli import build_parser
    from raymvc.scenario import load_scenario
    from raymvc.study.files import is_study_file, load_study
    from raymvc.study.sweep import parse_grid

    argv = shlex.split(cmd)[1:]
    if argv == ["--version"]:
        return  # prints and exits: test_every_listing_command_on_the_pages_runs runs it
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"{page}: `{cmd}` does not parse") from e
    files = [a for a in argv if a.endswith(".yaml") and not a.startswith("runs/")]
    paths = [_scenario_file(f) for f in files]
    if "data.path=" in cmd:
        _make_data_file(page, cmd, tmp_path)
    monkeypatch.chdir(tmp_path)  # relative paths of --set are read from here, as from a reader's folder
    for path in paths:
        if is_study_file(path):
            load_study(path).check()
            continue
        sets = list(getattr(args, "set", None) or [])
        grid = parse_grid(getattr(args, "grid", None) or [])
        points = [[f"{k}={v}" for k, v in zip([k for k, _ in grid], combo)]
                  for combo in zip(*[vals for _, vals in grid])] or [[]]
        for point in points:
            load_scenario(path, sets + point)


RUNNABLE = [(p, c) for p, c in COMMANDS if c.startswith("raymvc run ") and "--address" not in c
            and any(f"scenarios/{m}" in c for m in QUICK_METHODS) and "data.path" not in c]


@pytest.mark.parametrize("page, cmd", RUNNABLE, ids=[f"{p}:{c[:60]}" for p, c in RUNNABLE])
def test_every_quick_run_command_on_the_pages_runs(page, cmd, tmp_path, monkeypatch):
    """The closed-form methods' run commands run as shown (in-process, in a scratch folder)."""
    import shlex

    from raymvc.cli import main

    argv = shlex.split(cmd)[1:]
    argv = [str(REPO / a) if a.endswith(".yaml") else a for a in argv]
    if "--backend" not in argv:
        argv += ["--backend", "local"]
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--quiet"]) == 0, cmd


@pytest.mark.parametrize("cmd", sorted({c for _, c in COMMANDS if c.split()[1] in ("list", "params", "validate", "--version")
                                        or c.startswith("raymvc data list")}))
def test_every_listing_command_on_the_pages_runs(cmd, capsys, monkeypatch):
    import shlex

    from raymvc.cli import main

    argv = [str(REPO / a) if a.endswith(".yaml") and (REPO / a).is_file() else a for a in shlex.split(cmd)[1:]]
    if argv[:2] == ["params", "fedlloyd"]:  # the page runs it beside the example method
        monkeypatch.chdir(REPO / "examples" / "own_method")
    try:
        code = main(argv)
    except SystemExit as e:  # --version exits
        code = e.code
    assert code == 0, capsys.readouterr().err
