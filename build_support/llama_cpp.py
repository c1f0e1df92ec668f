"""Obtain and build the pinned llama.cpp for the eagle3 extension.

Meson runs this script in two ways:

``fetch DEST``
    Make sure the pinned llama-cpp-python source distribution (which vendors
    llama.cpp; subprojects/llama.cpp.wrap names it) is in DEST, verified by
    sha256. pip downloads it, so pip's own configuration decides where from.

``patch``
    Apply eagle3's patch series (patches/llama.cpp/series, -p1 patches with
    llama.cpp's own paths) to the extracted pinned tree. A stamp beside the
    tree records the series' hash: an unchanged series does nothing. When it
    changed, every file the old or the new series touches is taken again
    from the pristine archive, the series is applied to those copies, and
    only files whose content differs are written back (so CMake rebuilds
    only what changed, and ccache serves what it has seen).

``try-patches TREE``
    Try the series on another llama.cpp tree (a checkout of a newer commit,
    say) without writing to it: the files the patches touch are copied to a
    temporary folder and the patches applied there in order. Prints for each
    patch whether it applies, applies with offsets or fuzz, or fails (and
    where); the exit status is 1 if one fails.

``facts [--rpc true|false]``
    Print the pinned facts meson needs, one ``name=value`` per line: the
    sdist's folder, the upstream commit, the static libraries to link, and
    the series' files (meson reconfigures, and so patches again, when one
    of them changes).

``build --cmake CMAKE --source SRC --build-dir DIR --out-dir OUT [...]``
    Configure llama.cpp with CMake once, then build the static libraries the
    extension links (``llama-common`` and everything it depends on) into OUT.
    A build with nothing changed is a no-op; ccache is used when installed.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import patch_series  # noqa: E402  (build_support/patch_series.py)

# The pinned source: subprojects/llama.cpp.wrap names the archive, its folder
# and its sha256 (meson reads the same file); the upstream commit it vendors
# is stated here once.
ROOT = Path(__file__).resolve().parent.parent
WRAP = ROOT / "subprojects" / "llama.cpp.wrap"
# eagle3's patches to llama.cpp: the series file lists them in order.
SERIES = ROOT / "patches" / "llama.cpp" / "series"
PINNED_COMMIT = "0c1e57098"
SDIST_NAME = "llama-cpp-python"


def _wrap() -> dict[str, str]:
    parser = configparser.ConfigParser()
    parser.read(WRAP)
    return dict(parser["wrap-file"])


SDIST_FILE = _wrap()["source_filename"]
SDIST_DIRECTORY = _wrap()["directory"]
SDIST_SHA256 = _wrap()["source_hash"]
SDIST_VERSION = SDIST_DIRECTORY.rsplit("-", 1)[1]

# Static libraries produced by `cmake --build --target llama-common`, in link
# order (dependents before their dependencies); meson.build asks for this list.
LIBRARIES = (
    "libllama-common.a",
    "libllama-common-base.a",
    "libcpp-httplib.a",
    "libllama.a",
    "libggml.a",
    "libggml-rpc.a",
    "libggml-cpu.a",
    "libggml-base.a",
)
RPC_LIBRARY = "libggml-rpc.a"

# The extracted sdist (meson's subproject) and, beside its vendor/llama.cpp,
# the stamp of the series applied to it.
SDIST_ROOT = ROOT / "subprojects" / SDIST_DIRECTORY
ARCHIVE_DIR = ROOT / "subprojects" / "packagefiles"
STAMP_NAME = ".eagle3-patch-series.json"


def libraries(rpc: bool) -> tuple[str, ...]:
    return tuple(lib for lib in LIBRARIES if rpc or lib != RPC_LIBRARY)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_env() -> dict[str, str]:
    # Inside pip's isolated build environment PYTHONPATH points at the build
    # requirements only and pip itself is hidden; the interpreter's own pip
    # (and the user's pip configuration) is what we want.
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME"):
        env.pop(var, None)
    return env


def fetch(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / SDIST_FILE
    if archive.exists():
        if _sha256(archive) == SDIST_SHA256:
            return
        print(f"eagle3: {archive} has the wrong sha256; downloading it again", file=sys.stderr)
        archive.unlink()

    print(f"eagle3: downloading the {SDIST_NAME}=={SDIST_VERSION} source (llama.cpp {PINNED_COMMIT}) with pip",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
               "--dest", tmp, f"{SDIST_NAME}=={SDIST_VERSION}"]
        result = subprocess.run(cmd, env=_pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        got = Path(tmp) / SDIST_FILE
        if result.returncode != 0 or not got.exists():
            sys.exit(
                f"eagle3: could not download {SDIST_NAME}=={SDIST_VERSION} with pip:\n"
                f"{result.stdout[-4000:]}\n"
                f"Put {SDIST_FILE} (sha256 {SDIST_SHA256}) into {dest} by hand, or build against a "
                f"llama.cpp tree of your own with -Csetup-args=-Dllama_cpp_source=/path/to/llama.cpp"
            )
        digest = _sha256(got)
        if digest != SDIST_SHA256:
            sys.exit(f"eagle3: {SDIST_FILE} has sha256 {digest}, expected {SDIST_SHA256}; refusing to build")
        os.replace(got, archive)


def _series(series: Path) -> list[patch_series.Patch]:
    try:
        return patch_series.read_series(series)
    except patch_series.SeriesError as e:
        sys.exit(f"eagle3: {e}")


def _write_if_changed(path: Path, data: bytes | None, mode: int | None) -> bool:
    """Make ``path`` hold ``data`` (None: not exist), leaving it untouched (its
    mtime too) when it already does. Whether it changed."""
    if data is None:
        if path.exists() or path.is_symlink():
            path.unlink()
            return True
        return False
    if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".eagle3-tmp")
    tmp.write_bytes(data)
    if mode is not None:
        os.chmod(tmp, mode & 0o777)
    os.replace(tmp, path)
    return True


class _Lock:
    """An exclusive lock on a file (two builds configuring at once patch one after the other)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = self.path.open("a")
        try:
            import fcntl
            fcntl.flock(self.f, fcntl.LOCK_EX)
        except ImportError:  # (not POSIX: no lock)
            pass
        return self

    def __exit__(self, *exc):
        self.f.close()


def _pristine_files(archive_dir: Path):
    """(path in llama.cpp's tree, its content as a function, its mode) for every file of
    the archive's vendor/llama.cpp, in the archive's order."""
    prefix = f"{SDIST_DIRECTORY}/vendor/llama.cpp/"
    with tarfile.open(archive_dir / SDIST_FILE) as archive:
        for member in archive:
            if member.isfile() and member.name.startswith(prefix):
                yield member.name[len(prefix):], lambda m=member: archive.extractfile(m).read(), member.mode


def extract_pristine(paths: set[str], dest: Path, archive_dir: Path = ARCHIVE_DIR) -> None:
    """Write the pristine pinned version of each llama.cpp path in ``paths`` (those
    the archive has) under ``dest``, from the archive in ``archive_dir``."""
    for rel, content, _ in _pristine_files(archive_dir):
        if rel in paths:
            patch_series.stage([rel], lambda _: content(), dest)


def patch_pinned(sdist_root: Path = SDIST_ROOT, archive_dir: Path = ARCHIVE_DIR, series: Path = SERIES) -> bool:
    """Make the extracted sdist's vendor/llama.cpp the pristine archive's with the
    series applied. Whether anything was done (False: the stamp says this series is
    already there)."""
    vendor = sdist_root / "vendor" / "llama.cpp"
    if not (vendor / "common" / "speculative.h").exists():
        sys.exit(f"eagle3: {vendor} is not an extracted llama.cpp tree")
    patches = _series(series)
    want = patch_series.digest(series, patches)
    stamp = sdist_root / STAMP_NAME
    with _Lock(sdist_root / (STAMP_NAME + ".lock")):
        try:
            old = json.loads(stamp.read_text())
            old_files = set(old["files"])
            if old["digest"] == want:
                return False
        except (OSError, ValueError, KeyError, TypeError):
            old, old_files = None, set()

        fetch(archive_dir)
        new_files = patch_series.touched(patches)
        files = new_files | old_files
        restored = changed = 0
        with tempfile.TemporaryDirectory(prefix="eagle3-patch-") as tmp:
            staged = Path(tmp)
            modes: dict[str, int] = {}
            for rel, content, mode in _pristine_files(archive_dir):
                if rel in files:
                    modes[rel] = mode
                    patch_series.stage([rel], lambda _: content(), staged)
                elif old is None:
                    # no stamp: nothing says what else the tree went through, so every
                    # file is checked against the archive (once)
                    restored += _write_if_changed(vendor / rel, content(), mode)

            failed = []
            patch_series.apply_series(patches, staged, fuzz=0, stop_at_failure=True,
                                      report=lambda o: None if o.ok else failed.append(o))
            if failed:
                sys.exit(f"eagle3: the llama.cpp patch {failed[0].patch} does not apply to the pinned source "
                         f"({SDIST_FILE}): {failed[0].detail}.\nThe series is {series}; "
                         f"`python build_support/llama_cpp.py try-patches DIR` tries it on any tree.")
            for rel in sorted(files):
                src = staged / rel
                mode = modes.get(rel)
                if mode is None and (vendor / rel).exists():
                    mode = (vendor / rel).stat().st_mode
                changed += _write_if_changed(vendor / rel, src.read_bytes() if src.is_file() else None, mode)

        stamp.write_text(json.dumps({"digest": want, "series": [p.name for p in patches],
                                     "files": sorted(new_files)}, indent=1) + "\n")
    note = f", {restored} other files restored from the archive" if restored else ""
    print(f"eagle3: applied the llama.cpp patch series ({len(patches)} patches): {changed} files changed{note}",
          file=sys.stderr)
    return True


def try_patches(tree: Path, series: Path = SERIES, out=None) -> int:
    """Apply the series in order to a copy of what it touches in ``tree``; report each
    patch (to ``out``, default stdout). 0 if every patch applies, 1 if one does not,
    2 if ``tree`` is not a llama.cpp tree."""
    out = out or sys.stdout
    tree = tree.expanduser()
    if not ((tree / "ggml").is_dir() and (tree / "common").is_dir()):
        hint = (f" (its llama.cpp is {tree / 'vendor' / 'llama.cpp'})"
                if (tree / "vendor" / "llama.cpp" / "ggml").is_dir() else "")
        print(f"eagle3: {tree} is not a llama.cpp tree (no ggml/ and common/ folders){hint}", file=sys.stderr)
        return 2
    patches = _series(series)
    width = max(len(p.name) for p in patches)

    def read(rel: str) -> bytes | None:
        path = tree / rel
        return path.read_bytes() if path.is_file() else None

    def report(o: patch_series.Outcome) -> None:
        print(f"{o.patch:<{width}}  {o.describe()}", file=out, flush=True)

    with tempfile.TemporaryDirectory(prefix="eagle3-try-patches-") as tmp:
        patch_series.stage(patch_series.touched(patches), read, Path(tmp))
        outcomes = patch_series.apply_series(patches, Path(tmp), report=report)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print(f"{len(failed)} of {len(patches)} patches fail on {tree} (a patch that builds on a failing one "
              "is tried without it, and may fail for that reason)", file=out)
        return 1
    print(f"all {len(patches)} patches apply to {tree}", file=out)
    return 0


NO_AMX_FLAGS = ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]


def _cmake_args(source: Path, out_dir: Path, native: bool, build_type: str, examples: bool = False,
                amx: bool = False, llamafile: bool = True, batch_invariant: bool = True,
                rpc: bool = True) -> list[str]:
    off = "OFF"
    flags = []
    if native and not amx and platform.machine().lower() in ("x86_64", "amd64"):
        # -march=native turns on AMX where the CPU reports it, but virtual
        # machines often report AMX without enabling its state: the first AMX
        # instruction (ggml's q8_0/q4_0 kernels) then dies with SIGILL.
        flags += NO_AMX_FLAGS
    if batch_invariant:
        # The build's ggml patches: every pass size takes the same kernel for a
        # weight type, so a token of a target pass over a draft gets bit for bit
        # the logits it would get decoded alone (patches/llama.cpp/).
        flags.append("-DGGML_CPU_BATCH_INVARIANT")
    extra = []
    if flags:
        extra = [f"-DCMAKE_C_FLAGS={' '.join(flags)}", f"-DCMAKE_CXX_FLAGS={' '.join(flags)}"]
    return [*extra,
        f"-DCMAKE_BUILD_TYPE={build_type}",
        f"-DCMAKE_ARCHIVE_OUTPUT_DIRECTORY={out_dir}",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
        "-DLLAMA_BUILD_COMMON=ON",
        f"-DLLAMA_OPENSSL={off}",
        f"-DLLAMA_SUBPROCESS={off}",
        f"-DLLAMA_BUILD_APP={off}",
        f"-DLLAMA_BUILD_TESTS={off}",
        f"-DLLAMA_BUILD_TOOLS={off}",
        f"-DLLAMA_BUILD_EXAMPLES={'ON' if examples else off}",
        f"-DLLAMA_BUILD_SERVER={off}",
        # Explicit, so that SOURCE_DATE_EPOCH (set by some build frontends)
        # cannot silently turn the CPU options off.
        f"-DGGML_NATIVE={'ON' if native else 'OFF'}",
        "-DGGML_CCACHE=ON",
        # llamafile's tinyBLAS: matrix products that reuse each weight across
        # the tokens of a pass (verification, prompts).
        f"-DGGML_LLAMAFILE={'ON' if llamafile else off}",
        # llama.cpp's default, stated: a build dir configured otherwise is set back
        "-DGGML_OPENMP=ON",
        # the RPC backend (remote devices), over TCP only: RDMA would tie the
        # extension to whatever libibverbs the build machine happens to have
        f"-DGGML_RPC={'ON' if rpc else off}",
        f"-DGGML_RPC_RDMA={off}",
    ]


def cpu_reports_amx() -> bool:
    """Whether this machine's CPU reports Intel AMX tiles (Linux's cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and "amx_tile" in line.split() for line in f)
    except OSError:
        return False


# Stock's AMX kernels (ggml-cpu/amx/mmq.cpp) died with SIGILL at their first
# tile instruction on an Intel Xeon VM that grants AMX: built by GCC 12, their
# tile configuration loses its row and column stores before ldtilecfg (the
# compiler does not see the builtin read them), so no tile is configured. A
# stock build on a CPU that reports AMX leaves it out, as eagle3's own does.
STOCK_WITHOUT_AMX = ("stock llama.cpp is built without AMX on this CPU: its AMX kernels, "
                     "built by GCC 12, die with SIGILL at their first tile instruction")


def _stock_cmake_args(build_type: str) -> list[str]:
    """llama.cpp's own defaults, as a user building its tools would get them
    (no eagle3 option or define); only what cannot change speed is turned off,
    and AMX where the CPU reports it (STOCK_WITHOUT_AMX)."""
    args = [f"-DCMAKE_BUILD_TYPE={build_type}", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF", "-DGGML_CCACHE=ON"]
    if cpu_reports_amx():
        no_amx = " ".join(NO_AMX_FLAGS)
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    return args


def _build_env(source: Path, build_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SOURCE_DATE_EPOCH", None)
    # pip builds in a fresh temporary directory every time: rewrite absolute
    # paths relative to a common base so ccache hits across builds.
    env.setdefault("CCACHE_BASEDIR", os.path.commonpath([source.resolve(), build_dir.resolve()]))
    env.setdefault("CCACHE_NOHASHDIR", "1")
    return env


def build(cmake: str, source: Path, build_dir: Path, out_dir: Path, native: bool, build_type: str,
          jobs: int, targets: tuple[str, ...] = ("llama-common",), examples: bool = False, amx: bool = False,
          llamafile: bool = True, batch_invariant: bool = True, stock: bool = False, rpc: bool | None = None) -> None:
    source = source.resolve()  # a symlinked tree sends CMake's ninja into a regeneration loop
    if not (source / "common" / "speculative.h").exists():
        sys.exit(f"eagle3: {source} is not a llama.cpp tree with common/speculative.h")
    build_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = _build_env(source, build_dir)

    if stock:  # (with rpc: the one option a user must turn on to have llama.cpp's RPC tools at all)
        args = _stock_cmake_args(build_type) + (["-DGGML_RPC=ON"] if rpc else [])
    else:
        rpc = rpc is None or rpc
        args = _cmake_args(source, out_dir.resolve(), native, build_type, examples, amx, llamafile, batch_invariant,
                           rpc)
    stamp = build_dir / "eagle3-configure.json"
    wanted = json.dumps({"source": str(source), "args": args})
    if not (build_dir / "CMakeCache.txt").exists() or not stamp.exists() or stamp.read_text() != wanted:
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run([cmake, "-S", str(source), "-B", str(build_dir), *generator, *args], env=env, check=True)
        stamp.write_text(wanted)

    subprocess.run([cmake, "--build", str(build_dir), "--target", *targets, "--config", build_type,
                    "--parallel", str(jobs)], env=env, check=True)

    if stock:
        if cpu_reports_amx():
            print(f"eagle3: {STOCK_WITHOUT_AMX}", flush=True)
        return
    missing = [lib for lib in libraries(rpc) if not (out_dir / lib).exists()]
    if missing:
        sys.exit(f"eagle3: the llama.cpp build did not produce {', '.join(missing)} in {out_dir}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p_fetch = sub.add_parser("fetch", help="put the pinned llama.cpp source archive into DEST")
    p_fetch.add_argument("dest", type=Path)
    p_facts = sub.add_parser("facts", help="print the pinned source's folder, commit and libraries for meson")
    p_facts.add_argument("--rpc", choices=("true", "false"), default="true")
    p_patch = sub.add_parser("patch", help="apply the patch series to the extracted pinned tree (if not yet)")
    p_patch.add_argument("--series", type=Path, default=SERIES)
    p_try = sub.add_parser("try-patches", help="try the patch series on another llama.cpp tree, changing nothing")
    p_try.add_argument("tree", type=Path, help="the root of a llama.cpp tree (with ggml/ and common/)")
    p_try.add_argument("--series", type=Path, default=SERIES)

    p_build = sub.add_parser("build", help="build llama.cpp's static libraries")
    p_build.add_argument("--cmake", default="cmake")
    p_build.add_argument("--source", type=Path, required=True)
    p_build.add_argument("--build-dir", type=Path, required=True)
    p_build.add_argument("--out-dir", type=Path, required=True)
    p_build.add_argument("--native", choices=("true", "false"), default="true")
    p_build.add_argument("--amx", choices=("true", "false"), default="false")
    p_build.add_argument("--llamafile", choices=("true", "false"), default="true")
    p_build.add_argument("--batch-invariant", choices=("true", "false"), default="true")
    p_build.add_argument("--rpc", choices=("true", "false"), default=None,
                         help="llama.cpp's RPC backend (default: on, off for --stock)")
    p_build.add_argument("--build-type", default="Release")
    p_build.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p_build.add_argument("--target", action="append", dest="targets",
                         help="CMake target to build (repeatable; default llama-common)")
    p_build.add_argument("--examples", action="store_true", help="configure llama.cpp's examples too")
    p_build.add_argument("--stock", action="store_true",
                         help="llama.cpp's default options instead of eagle3's (for the benchmarks' comparisons)")

    args = parser.parse_args(argv)
    if args.command == "fetch":
        fetch(args.dest)
    elif args.command == "facts":
        series_files = [SERIES] + [p.path for p in _series(SERIES)]
        print(f"directory={SDIST_DIRECTORY}\ncommit={PINNED_COMMIT}\n"
              f"libraries={','.join(libraries(args.rpc == 'true'))}\n"
              f"series_files={','.join(os.path.relpath(f, ROOT) for f in series_files)}")
    elif args.command == "patch":
        patch_pinned(series=args.series)
    elif args.command == "try-patches":
        sys.exit(try_patches(args.tree, args.series))
    else:
        build(args.cmake, args.source, args.build_dir, args.out_dir, args.native == "true", args.build_type,
              args.jobs, tuple(args.targets or ("llama-common",)), args.examples, args.amx == "true",
              args.llamafile == "true", args.batch_invariant == "true", args.stock,
              None if args.rpc is None else args.rpc == "true")


if __name__ == "__main__":
    main()
