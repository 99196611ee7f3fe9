"""Carry an OpenVINO IR to a machine that cannot export one, without its weights.

The lent GPU machines' host is an AMX Xeon (docs/results/cuda/), the CPU the bf16 targets are set on, but
a device call carries 64 MiB and reaches no package registry: SmolLM2-135M's fp32 IR (540 MB) does not
travel, and optimum-intel's exporter cannot be installed there. The model that runs there is SmolLM2's
shapes with random weights anyway (tools/random_smollm2.py), so the IR need not carry SmolLM2's
weights either: speed does not depend on the values.

``pack`` keeps the IR's graph (the .xml), the tokenizer's IR and configs, and every constant of the .bin
byte for byte except the weight matrices (float constants of two or more dimensions and at least
``--min-elements`` elements); those are listed (offset, size, type, shape). ``unpack`` writes the .bin
back with each listed matrix drawn from N(0, 0.02²) (numpy, fixed seed): the same graph, with the
random weights that random_smollm2.py gives the torch side (same distribution, other draws).

    python3 tools/openvino_ir_skeleton.py pack ~/.cache/sparserl/openvino/smollm2-135m-fp32 .ov/ir.tar.xz
    python3 tools/openvino_ir_skeleton.py unpack .ov/ir.tar.xz $SPARSERL_CACHE/openvino/smollm2-135m-fp32
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

MODEL = "openvino_model"
FLOATS = {"f32": np.float32, "f16": np.float16}


def weight_ranges(xml_path: Path, min_elements: int) -> list[dict]:
    """The .bin ranges of the IR's weight matrices (deduplicated by offset)."""
    ranges = {}
    for layer in ET.parse(xml_path).getroot().iter("layer"):
        if layer.get("type") != "Const":
            continue
        data = layer.find("data").attrib
        shape = [int(s) for s in data.get("shape", "").split(",") if s.strip()]
        if data["element_type"] in FLOATS and len(shape) >= 2 and int(np.prod(shape)) >= min_elements:
            ranges[int(data["offset"])] = {
                "offset": int(data["offset"]),
                "size": int(data["size"]),
                "element_type": data["element_type"],
                "shape": shape,
            }
    return sorted(ranges.values(), key=lambda r: r["offset"])


def pack(ir: Path, out: Path, min_elements: int) -> None:
    bin_bytes = (ir / f"{MODEL}.bin").read_bytes()
    weights = weight_ranges(ir / f"{MODEL}.xml", min_elements)
    kept, pieces, pos = [], [], 0
    for r in weights + [{"offset": len(bin_bytes), "size": 0}]:
        if r["offset"] > pos:
            kept.append({"offset": pos, "size": r["offset"] - pos})
            pieces.append(bin_bytes[pos : r["offset"]])
        pos = max(pos, r["offset"] + r["size"])
    meta = {"bin_size": len(bin_bytes), "weights": weights, "kept": kept, "source": str(ir)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz") as tar:
        for f in sorted(ir.iterdir()):
            if f.name != f"{MODEL}.bin" and f.is_file():
                tar.add(f, arcname=f.name)
        for name, blob in (("skeleton.json", json.dumps(meta, indent=1).encode()), ("kept.bin", b"".join(pieces))):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    dropped = sum(r["size"] for r in weights)
    print(
        f"packed {ir} -> {out} ({out.stat().st_size / 2**20:.1f} MiB): {len(weights)} weight matrices "
        f"({dropped / 2**20:.0f} MiB) left to redraw, {sum(k['size'] for k in kept) / 2**20:.1f} MiB kept"
    )


def unpack(archive: Path, target: Path, seed: int) -> None:
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent if target.parent.exists() else None))
    try:
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(work, filter="data")
        meta = json.loads((work / "skeleton.json").read_text())
        kept = (work / "kept.bin").read_bytes()
        rng = np.random.default_rng(seed)
        with open(work / f"{MODEL}.bin", "wb") as f:
            f.truncate(meta["bin_size"])
            pos = 0
            for k in meta["kept"]:
                f.seek(k["offset"])
                f.write(kept[pos : pos + k["size"]])
                pos += k["size"]
            for r in meta["weights"]:
                dtype = FLOATS[r["element_type"]]
                values = (rng.standard_normal(int(np.prod(r["shape"])), dtype=np.float32) * 0.02).astype(dtype)
                assert values.nbytes == r["size"], r
                f.seek(r["offset"])
                f.write(values.tobytes())
        (work / "skeleton.json").unlink()
        (work / "kept.bin").unlink()
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"unpacked {archive} -> {target}: {len(meta['weights'])} weight matrices drawn from N(0, 0.02^2), seed {seed}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("ir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--min-elements", type=int, default=16384)
    u = sub.add_parser("unpack")
    u.add_argument("archive", type=Path)
    u.add_argument("target", type=Path)
    u.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.ir.expanduser(), args.out, args.min_elements)
    else:
        unpack(args.archive, args.target.expanduser(), args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
