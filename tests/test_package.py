"""What a user installs: one `speculax` package whose layers import one way.

A non-editable install into a fresh virtual environment (its third-party dependencies borrowed
from the test environment through a .pth file, so nothing is downloaded) must put `speculax`
alone into site-packages, import as `speculax`, run the `speculax` command, and keep the
import-linter contract of pyproject.toml (checked on the installed copy: the repository's
folders are subpackages only once installed).
"""
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
VENV_FILES = {"pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth",
              "deps.pth", "__pycache__"}


def _run(*cmd, cwd, **kw):
  return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(python, site-packages) of a fresh venv with a non-editable install of the repository."""
  root = tmp_path_factory.mktemp("fresh")
  venv = root / "venv"
  assert _run(sys.executable, "-m", "venv", venv, cwd=root).returncode == 0
  python = venv / "bin" / "python"
  site = pathlib.Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                           cwd=root).stdout.strip())
  (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
  # Build the wheel here (the fresh venv has no build backend), from a copy of the sources (a
  # build writes build/ and egg-info beside them), and install it there.
  src = root / "src"
  shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
      ".venv", ".git", "build", "runs", "results", "__pycache__", "*.egg-info"))
  out = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
             "--wheel-dir", root / "dist", src, cwd=root)
  assert out.returncode == 0, out.stderr
  wheel = next((root / "dist").glob("speculax-*.whl"))
  out = _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet",
             wheel, cwd=root)
  assert out.returncode == 0, out.stderr
  return python, site, root


def test_only_speculax_lands_in_site_packages(installed):
  python, site, root = installed
  top = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".egg-info"))}
  assert top - VENV_FILES == {"speculax"}
  assert _run(python, "-c", "import speculax.models.llama", cwd=root).returncode == 0
  for name in ("models", "decode", "train", "configs", "cli", "research", "core"):
    out = _run(python, "-c", f"import {name}", cwd=root)
    assert out.returncode != 0 and "No module named" in out.stderr, name


def test_the_installed_command_runs(installed):
  python, _, root = installed
  out = _run(python.parent / "speculax", "generate", "--help", cwd=root)
  assert out.returncode == 0 and "--drafter" in out.stdout, out.stderr


def test_layers_import_one_way(installed):
  """lint-imports on the installed copy, run from outside the repository (whose speculax/
  folder holds only the API module)."""
  _, site, root = installed
  lint = pathlib.Path(sys.executable).parent / "lint-imports"
  out = _run(lint, "--config", REPO / "pyproject.toml", "--no-cache", cwd=root,
             env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
  assert out.returncode == 0, out.stdout + out.stderr
  assert "0 broken" in out.stdout
