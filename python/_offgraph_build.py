"""The package's build backend (PEP 517), kept in the source tree so that
`pip install .` in python/ needs nothing from the network and no other
package: Debian 12's setuptools (66) builds a wheel only with the `wheel`
package installed, which a plain venv does not have, and pip's isolated
build would fetch both. This backend needs only the standard library, cmake
and a C compiler.

build_wheel configures and builds liboffgraph.so from the repository around
this folder (cmake, Release, target offgraph_shared) and writes a wheel that
holds the package (python/offgraph/*.py) with the library next to it as
offgraph/liboffgraph.so.<major>, where the package looks first after
OFFGRAPH_LIB. The wheel is tagged for this machine (py3-none-<platform>): the
library is native code, linked against this system's cJSON, OpenBLAS, PCRE2,
utf8proc, libmicrohttpd and xxHash (and CUDA's runtime when built with it).

Options, as pip's --config-settings KEY=VALUE (or the environment variable
in brackets):
  build-dir   (OFFGRAPH_BUILD_DIR)  a cmake build folder to configure and
              build in, kept (a later install rebuilds only what changed;
              an existing build of the repository is reused as it is
              configured); default: a fresh temporary folder
  cuda        (OFFGRAPH_CUDA)       AUTO (default: when nvcc is found), ON, OFF
  jobs        (OFFGRAPH_BUILD_JOBS) parallel compile jobs (default: the CPUs)
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_NAME = "offgraph"
_SUMMARY = "Python bindings of offgraph, an LLM inference runtime whose KV cache lives off the model graph"


def _header_version():
    """(major, minor) of include/offgraph.h: the library's ABI and the package's version."""
    header = os.path.join(_ROOT, "include", "offgraph.h")
    if not os.path.isfile(header) or not os.path.isfile(os.path.join(_ROOT, "CMakeLists.txt")):
        raise RuntimeError("offgraph's sources are not around %s (no %s): the package is built from the "
                           "repository's python/ folder" % (_HERE, header))
    with open(header, encoding="utf-8") as f:
        text = f.read()
    got = {}
    for part in ("MAJOR", "MINOR"):
        m = re.search(r"^#define OG_VERSION_%s (\d+)" % part, text, re.M)
        if not m:
            raise RuntimeError("%s defines no OG_VERSION_%s" % (header, part))
        got[part] = int(m.group(1))
    return got["MAJOR"], got["MINOR"]


def _version():
    """The package's version: its __version__, which must be the header's."""
    major, minor = _header_version()
    with open(os.path.join(_HERE, _NAME, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    want = "%d.%d" % (major, minor)
    if not m or m.group(1) != want:
        raise RuntimeError("python/offgraph/__init__.py's __version__ is %s; include/offgraph.h is %s" %
                           (m.group(1) if m else "missing", want))
    return want


def _setting(config_settings, key, env):
    v = (config_settings or {}).get(key)
    if isinstance(v, list):
        v = v[-1] if v else None
    if v is None:
        v = os.environ.get(env)
    return v or None


def _metadata(version):
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: >=3.8\n" %
            (_NAME, version, _SUMMARY))


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-%s" % plat


def _wheel_file(tag):
    return ("Wheel-Version: 1.0\nGenerator: offgraph _offgraph_build\nRoot-Is-Purelib: false\nTag: %s\n" % tag)


def _dist_info(version):
    return "%s-%s.dist-info" % (_NAME, version)


def _run(cmd, log):
    print("+ " + " ".join(cmd), file=log, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = r.stdout.decode("utf-8", "replace")
    log.write(out)
    log.flush()
    if r.returncode:
        raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), r.returncode, out[-6000:]))


def _build_library(config_settings):
    """Builds liboffgraph.so with cmake; the bytes of the SONAME'd file."""
    major, _ = _header_version()
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("cmake is needed to build liboffgraph.so (Debian: apt-get install cmake, or "
                           "scripts/install-deps.sh)")
    build = _setting(config_settings, "build-dir", "OFFGRAPH_BUILD_DIR")
    cuda = (_setting(config_settings, "cuda", "OFFGRAPH_CUDA") or "AUTO").upper()
    if cuda not in ("AUTO", "ON", "OFF"):
        raise RuntimeError("cuda must be AUTO, ON or OFF, not %r" % cuda)
    jobs = _setting(config_settings, "jobs", "OFFGRAPH_BUILD_JOBS") or str(os.cpu_count() or 1)
    log = sys.stderr
    temporary = not build
    build = tempfile.mkdtemp(prefix="offgraph-build-") if temporary else os.path.abspath(build)
    try:
        if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
            _run([cmake, "-S", _ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DOG_CUDA=%s" % cuda], log)
        _run([cmake, "--build", build, "--target", "offgraph_shared", "-j", jobs], log)
        lib = os.path.join(build, "liboffgraph.so.%d" % major)
        if not os.path.isfile(lib):
            raise RuntimeError("the build made no %s" % lib)
        with open(lib, "rb") as f:
            return f.read()
    finally:
        if temporary:
            shutil.rmtree(build, ignore_errors=True)


def _package_files():
    """(path in the wheel, path here) of the package's Python files."""
    pkg = os.path.join(_HERE, _NAME)
    out = []
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            out.append(("%s/%s" % (_NAME, name), os.path.join(pkg, name)))
    return out


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _write_wheel(wheel_directory, version, entries):
    """entries: (path in the wheel, bytes, executable). The wheel's file name."""
    tag = _tag()
    info = _dist_info(version)
    entries = list(entries) + [
        ("%s/METADATA" % info, _metadata(version).encode(), False),
        ("%s/WHEEL" % info, _wheel_file(tag).encode(), False),
        ("%s/top_level.txt" % info, (_NAME + "\n").encode(), False),
    ]
    record = [_record_line(a, d) for a, d, _ in entries] + ["%s/RECORD,," % info]
    entries.append(("%s/RECORD" % info, ("\n".join(record) + "\n").encode(), False))
    name = "%s-%s-%s.whl" % (_NAME, version, tag)
    path = os.path.join(wheel_directory, name)
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for arcname, data, executable in entries:
            zi = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = (0o755 if executable else 0o644) << 16
            z.writestr(zi, data)
    os.replace(tmp, path)
    return name


# ---------------------------------------------------------------- PEP 517

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    info = os.path.join(metadata_directory, _dist_info(version))
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(version))
    with open(os.path.join(info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file(_tag()))
    return _dist_info(version)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    major, _ = _header_version()
    lib = _build_library(config_settings)
    entries = []
    for arcname, path in _package_files():
        with open(path, "rb") as f:
            entries.append((arcname, f.read(), False))
    entries.append(("%s/liboffgraph.so.%d" % (_NAME, major), lib, True))
    return _write_wheel(wheel_directory, version, entries)
