# Sourced on a node with no network, from any folder:   source <bundle>/setup.sh
# `python -m pipeline.bundle` (make bundle) writes it beside site.tar.xz and manifest.json. It checks this node's
# Python and torch against the manifest, unpacks the archive once (beside it, or into $AUGSSL_SITE), and puts the
# packages and the project first on the path of every process of that Python: a .pth file in its site-packages
# (Ray's workers, started by `ray start` or by a job, read it too) and PYTHONPATH and PATH in this shell.
# PYTHON picks the interpreter (default: python3 on PATH); AUGSSL_ROOT the project (default: the folder above the
# bundle when it is the project, else the current folder when it is). docs/cluster.md, "Air-gapped nodes".
_augssl_env=$("${PYTHON:-python3}" - "$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)" <<'PY'
import json
import os
import shlex
import shutil
import site
import sys
import sysconfig
import tarfile
from importlib import metadata

bundle = sys.argv[1]


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def version_tuple(v):
    return tuple(int(x) for x in v.split("+")[0].split(".")[:2])


def in_range(version, spec):  # ">=2.11,<2.15": major.minor bounds
    low, high = (version_tuple(bound.lstrip("<>=")) for bound in spec.split(","))
    return low <= version_tuple(version) < high


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


try:
    manifest = json.load(open(os.path.join(bundle, "manifest.json")))
except OSError as e:
    fail(f"{bundle} holds no manifest.json ({e.strerror}): source the setup.sh of a bundle made by python -m pipeline.bundle")
here = f"{sys.version_info.major}.{sys.version_info.minor}"
if here != manifest["python"]:
    fail(f"this bundle is for Python {manifest['python']} and {sys.executable} is {here}: set PYTHON to a {manifest['python']}, "
         f"or build a bundle with --python {here}")
for name, spec in manifest["expects"].items():
    v = installed(name)
    if v is None:
        fail(f"{sys.executable} has no {name}: install the node's own CUDA build of it first (no bundle carries it)")
    if not in_range(v, spec):
        print(f"warning: {name} {v} is outside the versions the project is tested on ({spec})", file=sys.stderr)
missing = sorted(n for n in manifest["left_out"] if n not in manifest["expects"] and installed(n) is None)
if missing:
    fail(f"{sys.executable} lacks {', '.join(missing)}, which the bundle left out as already there: rebuild it with "
         f"this node's `pip freeze` as --has")

target = os.path.abspath(os.environ.get("AUGSSL_SITE") or os.path.join(bundle, "site"))
stamp = os.path.join(target, ".augssl-bundle")
fresh = os.path.exists(stamp) and open(stamp).read().strip() == manifest["archive_sha256"]
if not fresh:
    if os.path.isdir(target) and os.listdir(target) and not os.path.exists(stamp):
        fail(f"{target} is not empty and holds no bundle: set AUGSSL_SITE to a new folder")
    print(f"unpacking {manifest['unpacked_bytes'] / 2**20:.0f} MiB into {target}", file=sys.stderr)
    partial = target + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(os.path.join(bundle, "site.tar.xz")) as tar:
        try:
            tar.extractall(partial, filter="data")
        except TypeError:  # a Python without extraction filters
            tar.extractall(partial)
    scripts = os.path.join(partial, "bin")  # console scripts (ray, mlflow, ...): this node's interpreter
    for entry in os.scandir(scripts) if os.path.isdir(scripts) else ():
        with open(entry.path, "rb") as f:
            head, rest = f.readline(), f.read()
        if head.startswith(b"#!") and b"python" in head:
            with open(entry.path, "wb") as f:
                f.write(b"#!" + sys.executable.encode() + b"\n" + rest)
    with open(os.path.join(partial, ".augssl-bundle"), "w") as f:
        f.write(manifest["archive_sha256"] + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.rename(partial, target)


def is_project(folder):
    path = os.path.join(folder, "pyproject.toml")
    return os.path.isfile(path) and 'name = "augssl"' in open(path).read()


root = os.environ.get("AUGSSL_ROOT") or next(
    (f for f in (os.path.dirname(bundle), os.getcwd()) if is_project(f)), None
)
first = [target] + ([os.path.abspath(root)] if root else [])
line = f"import sys; sys.path[:0] = [p for p in {first!r} if p not in sys.path]\n"
folders = [sysconfig.get_paths()["purelib"]] + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
pth = None
for folder in folders:
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "augssl-bundle.pth"), "w") as f:
            f.write(line)
        pth = os.path.join(folder, "augssl-bundle.pth")
        break
    except OSError:
        continue
if pth is None:
    print(f"warning: no site-packages of {sys.executable} is writable: only processes started from this shell "
          f"(PYTHONPATH) see the bundle", file=sys.stderr)
old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
torch = installed("torch")
print(f"augssl bundle: Python {sys.version.split()[0]} ({sys.executable}), torch {torch}, "
      f"{len(manifest['carried'])} packages in {target}" + (f", on every process's path through {pth}" if pth else "")
      + (f"; project {root}" if root else "; no project found (set AUGSSL_ROOT)"), file=sys.stderr)
print(f"export PYTHONPATH={shlex.quote(os.pathsep.join(first + old))}")
# the bundle's console scripts, then this interpreter's folder: `python3` in this shell is the one checked above
path = [os.path.join(target, "bin"), os.path.dirname(sys.executable)]
path += [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in path]
print(f"export PATH={shlex.quote(os.pathsep.join(path))}")
print(f"export AUGSSL_PYTHON={shlex.quote(sys.executable)}")
PY
) && eval "$_augssl_env"
_augssl_rc=$?
unset _augssl_env
return $_augssl_rc 2>/dev/null || exit $_augssl_rc
