"""An offline bundle of the project's Python dependencies, for nodes with no network that already have a Python and a
CUDA build of torch (company GPU clusters, HPC sites, the lent GPU machine).

    python -m pipeline.bundle --python 3.12 --has infra/bundle/lent-gpu.txt        # or: make bundle PY=3.12 HAS=...
    python -m pipeline.bundle --has target-freeze.txt --extras test --out /tmp/b   # a `pip freeze` of the target

Writes OUT/site.tar.xz (the packages, unpacked, for the target's Python and manylinux x86_64), OUT/manifest.json
(what is in it, what was left out and the versions it was resolved against) and OUT/setup.sh, which a shell on the
target sources: `source OUT/setup.sh`. Nothing is fetched there.

What the target already has is left out: torch, torchvision and triton always (a node's own CUDA build; the bundle
never carries them), and every package named by --has (a `pip freeze` or `pip list` of the target, or one name a
line) or --exclude. The resolution sees the target's pinned versions as constraints, so what is carried fits what is
there; the rest follows the versions installed where the bundle is built (the project's tested environment). A
dependency published only as a pure-Python sdist (Hydra's antlr4 runtime) is built into a wheel here first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP_SH = ROOT / "infra" / "bundle" / "setup.sh"
NEVER_CARRIED = {"torch", "torchvision", "triton"}  # the target's own CUDA build of torch
DALI = "nvidia-dali-cuda120"  # ~1 GB of CUDA libraries: carried only with --dali
SUPPORTED_TORCH = ">=2.11,<2.15"  # docs/testing.md, "Other torch versions"
SUPPORTED_TORCHVISION = ">=0.26,<0.30"
# Parts of carried packages that no job of ours imports, dropped to keep the archive small. Each is a path under the
# site folder; the bundle's check (docs/testing.md) runs the fast suite and a pretraining from the pruned bundle.
PRUNED = (
    "ray/rllib",  # reinforcement learning
    "ray/serve",  # model serving
    "ray/jars",  # Ray's Java workers
    "ray/core/src/ray/raylet/raylet.debug",
)


class BundleError(Exception):
    """Bad input or a failed resolution: the command prints it as one `error:` line."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_target(text: str) -> dict[str, str | None]:
    """Packages a target has, from `pip freeze` (name==version, name @ url), `pip list` (name version) or one name a
    line; comments, options and editable lines are skipped. Maps the canonical name to its version, or None."""
    has: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith(("-", "Package", "---")):
            continue
        if m := re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*===?\s*(\S+)", line):
            has[canonical(m[1])] = m[2]
        elif m := re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*@\s*\S+", line):
            has[canonical(m[1])] = None
        elif m := re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\s+(\d\S*))?(?:\s+\S+)?", line):
            has[canonical(m[1])] = m[2]
        else:
            raise BundleError(f"cannot read {raw.strip()!r} as a package (name, name==version or `pip list` row)")
    return has


def project_requirements(pyproject: Path, extras: list[str], dali: bool) -> list[str]:
    """The project's dependencies (and those of the extras), torch and torchvision left out, DALI only if asked."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise BundleError(
            f"--extras {' '.join(unknown)}: pyproject.toml has no such extra (it has {', '.join(optional)})"
        )
    reqs = list(project["dependencies"]) + [r for e in extras for r in optional[e]]
    keep = []
    for r in reqs:
        name = canonical(re.split(r"[\s<>=!~;\[@]", r, maxsplit=1)[0])
        if name in NEVER_CARRIED or (name == DALI and not dali) or name == "detectron2":
            continue  # detectron2: not on PyPI, built per site against its torch (docs/detection.md)
        keep.append(r)
    return keep


def public_version(version: str) -> str:
    """2.11.0+cu130 -> 2.11.0: a local label names a build PyPI does not have."""
    return version.split("+", 1)[0]


def local_versions() -> dict[str, str]:
    """The versions installed where the bundle is built: the environment the project's tests ran in."""
    out = {}
    for d in metadata.distributions():
        name = d.metadata["Name"]
        if name and not d.read_text("direct_url.json"):  # editable or local installs: not on an index
            out[canonical(name)] = d.version
    return out


def constraints(has: dict[str, str | None], local: dict[str, str]) -> dict[str, str]:
    """name -> version to resolve against: the target's own pins first, then the local environment's."""
    pins = {n: public_version(v) for n, v in local.items() if n not in has and n not in NEVER_CARRIED}
    pins.update({n: public_version(v) for n, v in has.items() if v})
    return pins


def platform_args(python: str, glibc: str) -> list[str]:
    """pip's flags for CPython `python` on manylinux x86_64 with glibc up to `glibc` (binary wheels only)."""
    major, minor = (int(x) for x in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(5, minor + 1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]  # the legacy names of 2_17, 2_12, 2_5
    abi = "cp" + python.replace(".", "")  # pip adds abi3 and none by itself
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", abi]
    for t in tags:
        args += ["--platform", t]
    return args


def _pip(args: list[str], log) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    log(done.stdout + done.stderr)
    return done


def unavailable(pip_output: str) -> dict[str, str]:
    """The packages pip found no distribution of for the target, in the order it names them, each with the
    requirement it was asked for (`antlr4-python3-runtime==4.9.*`), or its bare name where pip does not say."""
    specs = re.findall(r"Could not find a version that satisfies the requirement (\S+)", pip_output)
    block = re.search(r"no matching distributions available for your environment:\n((?:[ \t]+\S+\n?)+)", pip_output)
    for name in block[1].split() if block else []:
        asked = re.search(rf"depends on ({re.escape(name)}\S*)", pip_output, re.IGNORECASE)
        specs.append(asked[1] if asked else name)
    out: dict[str, str] = {}
    for spec in specs:
        out.setdefault(canonical(re.split(r"[<>=!~\[;]", spec, maxsplit=1)[0]), spec)
    return out


def resolve(reqs: list[str], pins: dict[str, str], plat: list[str], work: Path, log) -> list[dict]:
    """The packages pip would install on the target: [{name, version}]. A package with no wheel for the target is
    built into a wheel here when it is pure Python (an sdist-only package); else, when the local environment pinned
    it, the pin is dropped (that version has no wheel for the target's Python); else the bundle cannot be made."""
    wheelhouse = work / "wheelhouse"
    wheelhouse.mkdir(exist_ok=True)
    pins = dict(pins)
    tried: set[str] = set()
    for _ in range(20):
        (work / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        report = work / "report.json"
        dry = ["install", "--dry-run", "--ignore-installed", "--report", str(report), "--target", str(work / "dry")]
        links = ["--find-links", str(wheelhouse), "-c", str(work / "constraints.txt")]
        done = _pip([*dry, *plat, *links, *reqs], log)
        if done.returncode == 0:
            items = json.loads(report.read_text())["install"]
            return [{"name": canonical(i["metadata"]["name"]), "version": i["metadata"]["version"]} for i in items]
        missing = unavailable(done.stdout + done.stderr)
        todo = [n for n in missing if n not in tried or n in pins]
        if not todo:
            raise BundleError(
                "pip could not resolve the dependencies (pip.log beside the bundle says why): "
                + _last_error(done.stderr)
            )
        name = todo[0]
        if name not in tried:
            tried.add(name)
            spec = f"{name}=={pins[name]}" if name in pins else missing[name]
            _pip(["wheel", "--quiet", "--no-deps", "-w", str(wheelhouse), spec], log)
            made = list(wheelhouse.glob(f"{name.replace('-', '_')}-*-none-any.whl"))
            if made:
                log(f"built {made[0].name} here: {name} has no wheel on the index\n")
                continue
            for stray in wheelhouse.glob(f"{name.replace('-', '_')}-*.whl"):  # built, but not pure Python
                stray.unlink()
        if name in pins:
            log(f"no wheel of {name}=={pins.pop(name)} for the target: the local pin is dropped\n")
            continue
        raise BundleError(f"{name} has no wheel for CPython on manylinux x86_64 and is not pure Python")
    raise BundleError("pip's resolution did not settle in 20 tries (pip.log beside the bundle)")


def _last_error(stderr: str) -> str:
    errors = [ln.strip() for ln in stderr.splitlines() if ln.startswith("ERROR")]
    return errors[-1] if errors else stderr.strip().splitlines()[-1] if stderr.strip() else "(no output)"


def install(packages: list[dict], site: Path, plat: list[str], work: Path, log) -> None:
    specs = [f"{p['name']}=={p['version']}" for p in packages]
    flags = ["install", "--quiet", "--no-deps", "--no-compile", "--target", str(site)]
    done = _pip([*flags, *plat, "--find-links", str(work / "wheelhouse"), *specs], log)
    if done.returncode:
        raise BundleError("pip could not install the resolved packages: " + _last_error(done.stderr))


def prune(site: Path) -> int:
    """Drop byte code and the parts in PRUNED; returns the bytes removed."""
    gone = 0
    for rel in PRUNED:
        p = site / rel
        if p.exists():
            gone += _size(p)
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    for p in list(site.rglob("__pycache__")):
        gone += _size(p)
        shutil.rmtree(p)
    return gone


def _size(p: Path) -> int:
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def archive(site: Path, out: Path) -> None:
    """site/ as out (tar, xz at its strongest setting; `xz` on both cores when the machine has it)."""
    tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
    with out.open("wb") as f:
        if shutil.which("xz"):
            xz = subprocess.run(["xz", "-9", "-T0", "-c"], stdin=tar.stdout, stdout=f)
        else:
            import lzma

            assert tar.stdout is not None
            f.write(lzma.compress(tar.stdout.read(), preset=9))
            xz = subprocess.CompletedProcess([], 0)
    if tar.wait() or xz.returncode:
        raise BundleError(f"could not write {out}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def build(args: argparse.Namespace, log=print) -> dict:
    """The whole bundle into args.out; returns its manifest."""
    has: dict[str, str | None] = {}
    for f in args.has:
        has.update(read_target(Path(f).read_text()))
    has.update({canonical(n): None for n in args.exclude})
    reqs = args.requirement or project_requirements(ROOT / "pyproject.toml", args.extras, args.dali)
    pins = constraints(has, {} if args.no_local_pins else local_versions())
    plat = platform_args(args.python, args.glibc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="augssl-bundle-") as tmp:
        work = Path(tmp)
        notes = (out / "pip.log").open("w")  # pip's own words, for when a resolution fails
        print(
            f"resolving {len(reqs)} requirements for CPython {args.python}, manylinux x86_64 (glibc <= {args.glibc})",
            flush=True,
        )
        resolved = resolve(reqs, pins, plat, work, notes.write)
        left_out = {p["name"]: p["version"] for p in resolved if p["name"] in has or p["name"] in NEVER_CARRIED}
        carried = [p for p in resolved if p["name"] not in left_out]
        print(
            f"{len(carried)} packages to carry; {len(left_out)} left out, the target has them: "
            + (", ".join(sorted(left_out)) or "none")
        )
        site = work / "site"
        install(carried, site, plat, work, notes.write)
        pruned = prune(site)
        unpacked = _size(site)
        print(f"installed {unpacked / 2**20:.0f} MiB unpacked ({pruned / 2**20:.0f} MiB pruned); compressing")
        tarball = out / "site.tar.xz"
        archive(site, tarball)
    manifest = {
        "python": args.python,
        "platform": f"manylinux_{args.glibc.replace('.', '_')}_x86_64",
        "built": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "archive_sha256": sha256(tarball),
        "archive_bytes": tarball.stat().st_size,
        "unpacked_bytes": unpacked,
        "expects": {} if args.requirement else {"torch": SUPPORTED_TORCH, "torchvision": SUPPORTED_TORCHVISION},
        "left_out": left_out,  # the target must have these (its versions were the constraints)
        "carried": {p["name"]: p["version"] for p in carried},
        "extras": args.extras,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.copyfile(SETUP_SH, out / "setup.sh")
    print(f"wrote {tarball} ({manifest['archive_bytes'] / 2**20:.1f} MiB), {out / 'manifest.json'}, {out / 'setup.sh'}")
    print(f"on the target, from the project's root: source {out}/setup.sh")
    return manifest


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.bundle", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    ap.add_argument("--python", default=here, help=f"the target's Python, major.minor (default {here}, this one)")
    ap.add_argument("--glibc", default="2.28", help="the oldest glibc among the target nodes (default 2.28)")
    ap.add_argument(
        "--has",
        action="append",
        default=[],
        metavar="FILE",
        help="what the target has: its `pip freeze`, `pip list`, or a name a line (repeatable)",
    )
    ap.add_argument("--exclude", nargs="+", default=[], metavar="NAME", help="more packages the target has")
    ap.add_argument("--extras", nargs="+", default=[], metavar="EXTRA", help="pyproject extras to carry, e.g. test")
    ap.add_argument("--dali", action="store_true", help=f"carry {DALI} too (about 1 GB)")
    ap.add_argument("--requirement", nargs="+", default=[], metavar="REQ", help=argparse.SUPPRESS)  # tests
    ap.add_argument("--no-local-pins", action="store_true", help="resolve without this environment's versions")
    ap.add_argument("--out", default=str(ROOT / ".bundle"), help="the bundle's folder (default .bundle)")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"3\.\d{1,2}", args.python):
        raise BundleError(f"--python {args.python}: give the target's Python as major.minor, e.g. 3.12")
    if not re.fullmatch(r"2\.\d{1,2}", args.glibc):
        raise BundleError(f"--glibc {args.glibc}: give a glibc version as 2.N, e.g. 2.28")
    for f in args.has:
        if not Path(f).is_file():
            raise BundleError(f"--has {f}: no such file (write one on the target with `python3 -m pip freeze > {f}`)")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        build(parse(argv))
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
