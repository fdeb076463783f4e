"""PEP 825 variant wheels made from the ordinary per-variant wheels.

An ordinary wheel carries its variant in the local version label
(``vllm_engine-0.1.dev5+g1a2b3c4.cu130-cp38-abi3-manylinux_2_34_x86_64.whl``);
its variant wheel has the same files under one version for every variant of
the commit, with the variant moved to the variant label
(``vllm_engine-0.1.dev5+g1a2b3c4-cp38-abi3-manylinux_2_34_x86_64-cu130.whl``),
a ``.dist-info/variant.json`` and a METADATA and RECORD that agree.

Properties follow what uv 0.13's vendored NVIDIA provider reports (namespace
``nvidia``, feature ``cuda_version_lower_bound``, one value per CUDA version
the driver supports, newest first). A CUDA variant asks for ``<major>.0``: any
driver of that CUDA major runs it (NVIDIA's minor-version compatibility, the
same thresholds as tools.target: >= 580 for CUDA 13, >= 525.60.13 for CUDA 12).
The cpu variant has no property, so it is PEP 825's null variant: compatible
everywhere, ranked below every CUDA variant the machine supports, what a machine
without a usable NVIDIA driver gets. The draft, and variantlib (its reference
implementation), require a null variant to carry the label ``null``: its variant
wheel is ``...-manylinux_2_34_x86_64-null.whl``, while the index's metadata.json,
the wheel's build info and everything else still call the variant ``cpu``. ROCm and XPU get
no variant wheel: uv implements no provider for them, so no machine could ever select one.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import struct
import zipfile
from pathlib import Path
from typing import IO

from packaging.utils import canonicalize_name
from packaging.version import Version

from tools.errors import UserError
from tools.variants import get_variant
from wheel_index.layout import PROJECT
from wheel_index.wheels import InspectedWheel

#: The draft schema uv 0.13 validates variant metadata against.
SCHEMA = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
NVIDIA = "nvidia"
#: uv answers this provider from its vendored copy (no plugin is installed or run);
#: both keys must be present for uv to recognise it.
NVIDIA_PROVIDER = {"requires": ["nvidia-variant-provider"],
                   "plugin-api": "nvidia_variant_provider.plugin:NvidiaVariantPlugin"}
CUDA_LOWER_BOUND = "cuda_version_lower_bound"
VARIANT_JSON = "variant.json"
#: A member's local file header (zip APPNOTE 4.3.7; zipfile's structFileHeader, which
#: typeshed does not declare): 30 bytes, the name's and extra field's lengths last.
LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")


#: PEP 825's label for the variant without properties (variantlib refuses any other)
NULL_LABEL = "null"


def properties(label: str) -> dict | None:
    """The variant properties of a variant, or None when it gets no variant wheel."""
    v = get_variant(label)
    if v.device == "cpu":
        return {}
    if v.device == "cuda" and v.toolkit:
        return {NVIDIA: {CUDA_LOWER_BOUND: [f"{v.toolkit.split('.')[0]}.0"]}}
    return None


def wheel_label(label: str) -> str:
    """The variant label a variant wheel of this variant (tools.variants) carries
    in its name and its variant.json: `null` for the one without properties."""
    return NULL_LABEL if properties(label) == {} else label


def metadata_doc(labels) -> dict:
    """variants.json (index level) for these variants (tools.variants labels);
    with one label, the wheel's own variant.json."""
    variants = {}
    for label in sorted(labels):
        props = properties(label)
        if props is None:
            raise UserError(f"variant {label!r} has no variant properties a provider reports")
        variants[wheel_label(label)] = props
    # uv refuses an empty namespace list, so the provider is declared even when
    # only the cpu variant is published.
    return {"$schema": SCHEMA, "default-priorities": {"namespace": [NVIDIA]},
            "providers": {NVIDIA: NVIDIA_PROVIDER}, "variants": variants}


def encode(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def base_version(version: Version) -> str:
    """The version every variant of a commit shares: the local label without
    its last part (the variant); a release without a label stays as it is."""
    if version.local is None:
        return str(version)
    rest = version.local.split(".")[:-1]
    return f"{version.public}+{'.'.join(rest)}" if rest else version.public


def dist_stem(version: str) -> str:
    return f"{canonicalize_name(PROJECT).replace('-', '_')}-{version}"


def variants_json_name(version: str) -> str:
    return f"{dist_stem(version)}-variants.json"


def variant_filename(w: InspectedWheel) -> str:
    py, abi, plat = w.tags
    label = wheel_label(w.variant)
    return f"{dist_stem(base_version(w.version))}-{py}-{abi}-{plat}-{label}.whl"


def is_variant_wheel(filename: str) -> bool:
    """A PEP 825 name: a variant label after the platform tag (six fields, no build tag)."""
    parts = filename.removesuffix(".whl").split("-")
    return filename.endswith(".whl") and len(parts) == 6 and not parts[2][:1].isdigit()


#: What uv 0.13 needs to read or install a variant wheel.
UV_PREVIEW = ("--preview-features", "wheel-variants")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def _set_version(metadata: bytes, version: str) -> bytes:
    lines = metadata.decode("utf-8").split("\n")
    for i, line in enumerate(lines):
        if line.startswith("Version:"):
            lines[i] = f"Version: {version}"
            return "\n".join(lines).encode("utf-8")
        if line == "":  # headers end at the first empty line
            break
    raise UserError("METADATA has no Version header; not a valid wheel")


def _open_fp(z: zipfile.ZipFile) -> IO[bytes]:
    if z.fp is None:  # zipfile sets it to None on close()
        raise ValueError(f"{z.filename}: the zip archive is already closed")
    return z.fp


def _copy_compressed(src: zipfile.ZipFile, info: zipfile.ZipInfo, dst: zipfile.ZipFile) -> str:
    """Copy one member's compressed bytes unchanged and return its RECORD hash.

    zipfile has no raw copy, and recompressing a CUDA build's extension costs
    seconds per 100 MB; the local header is rebuilt by ZipInfo.FileHeader and
    the bytes after it are taken as they are."""
    src_fp, dst_fp = _open_fp(src), _open_fp(dst)
    src_fp.seek(info.header_offset)
    fields = LOCAL_HEADER.unpack(src_fp.read(LOCAL_HEADER.size))
    src_fp.seek(info.header_offset + LOCAL_HEADER.size + fields[10] + fields[11])
    raw = src_fp.read(info.compress_size)
    digest = hashlib.sha256()
    with src.open(info) as f:  # also checks the CRC
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
    copy.compress_type, copy.external_attr = info.compress_type, info.external_attr
    copy.CRC, copy.compress_size, copy.file_size = info.CRC, info.compress_size, info.file_size
    dst_fp.seek(dst.start_dir)
    copy.header_offset = dst.start_dir
    dst_fp.write(copy.FileHeader(zip64=copy.file_size > zipfile.ZIP64_LIMIT))
    dst_fp.write(raw)
    dst.start_dir = dst_fp.tell()
    dst.filelist.append(copy)
    dst.NameToInfo[copy.filename] = copy
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def make_variant_wheel(w: InspectedWheel, out_dir: Path) -> Path:
    """Write the variant wheel of `w` into out_dir (same bytes for the same input)."""
    props = properties(w.variant)
    if props is None:
        raise UserError(f"{w.filename}: variant {w.variant!r} gets no variant wheel")
    version = base_version(w.version)
    out = Path(out_dir) / variant_filename(w)
    with zipfile.ZipFile(w.path) as src:
        infos = src.infolist()
        old_info = next(i.filename.split("/")[0] for i in infos if i.filename.count("/") == 1
                        and i.filename.endswith(".dist-info/METADATA"))
        old_stem = old_info[:-len(".dist-info")]
        new_stem = dist_stem(version)
        record_name = f"{new_stem}.dist-info/RECORD"
        rows = []
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            def put(info: zipfile.ZipInfo, name: str, data: bytes) -> None:
                new = zipfile.ZipInfo(name, date_time=info.date_time)
                new.external_attr, new.compress_type = info.external_attr, info.compress_type
                dst.writestr(new, data)
                rows.append((name, _record_hash(data), str(len(data))))

            for info in infos:
                if info.is_dir():
                    continue
                top, _, rest = info.filename.partition("/")
                if top not in (f"{old_stem}.dist-info", f"{old_stem}.data"):
                    rows.append((info.filename, _copy_compressed(src, info, dst),
                                 str(info.file_size)))
                    continue
                name = f"{new_stem}{top[len(old_stem):]}/{rest}"
                if name == record_name:
                    continue  # rewritten below, for the renamed and changed files
                data = src.read(info)
                if name == f"{new_stem}.dist-info/METADATA":
                    data = _set_version(data, version)
                put(info, name, data)
            meta_info = src.getinfo(f"{old_stem}.dist-info/METADATA")
            put(meta_info, f"{new_stem}.dist-info/{VARIANT_JSON}",
                encode(metadata_doc([w.variant])))
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows + [(record_name, "", "")])
            dst.writestr(zipfile.ZipInfo(record_name, date_time=meta_info.date_time),
                         buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    return out
