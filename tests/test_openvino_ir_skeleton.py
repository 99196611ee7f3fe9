"""tools/openvino_ir_skeleton.py: an IR carried without its weight matrices comes back with the same
graph, every small constant byte for byte, and each weight matrix redrawn from N(0, 0.02²)."""

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("openvino_ir_skeleton", ROOT / "tools" / "openvino_ir_skeleton.py")
skeleton = importlib.util.module_from_spec(spec)
spec.loader.exec_module(skeleton)


def _fake_ir(folder: Path) -> dict[str, tuple[int, bytes]]:
    """An IR-shaped folder: a weight matrix, a second one sharing nothing, a norm vector, an i64 shape
    constant and a small 2-D float constant, with padding between them; returns name -> (offset, bytes)."""
    rng = np.random.default_rng(1)
    blobs = {
        "embed": rng.standard_normal((256, 128)).astype(np.float32).tobytes(),
        "norm": np.ones(128, np.float32).tobytes(),
        "shape": np.array([1, -1, 128], np.int64).tobytes(),
        "proj": rng.standard_normal((128, 192)).astype(np.float32).tobytes(),
        "rope": rng.standard_normal((2, 32)).astype(np.float32).tobytes(),
    }
    meta = {
        "embed": ("f32", "256, 128"),
        "norm": ("f32", "128"),
        "shape": ("i64", "3"),
        "proj": ("f32", "128, 192"),
        "rope": ("f32", "2, 32"),
    }
    layout, data = {}, b""
    for name, blob in blobs.items():
        data += b"\0" * 8  # alignment padding, kept as is
        layout[name] = (len(data), blob)
        data += blob
    layers = "\n".join(
        f'<layer id="{i}" name="{name}" type="Const" version="opset1"><data element_type="{meta[name][0]}" '
        f'shape="{meta[name][1]}" offset="{layout[name][0]}" size="{len(blob)}"/></layer>'
        for i, (name, blob) in enumerate(blobs.items())
    )
    folder.mkdir()
    (folder / "openvino_model.xml").write_text(
        f'<?xml version="1.0"?>\n<net name="m" version="11"><layers>\n{layers}\n</layers></net>\n'
    )
    (folder / "openvino_model.bin").write_bytes(data)
    (folder / "openvino_tokenizer.xml").write_text("<net/>")
    return layout


def test_pack_then_unpack_keeps_the_graph_and_small_constants_and_redraws_the_weights(tmp_path):
    layout = _fake_ir(tmp_path / "ir")
    archive = tmp_path / "ir.tar.xz"
    skeleton.main(["pack", str(tmp_path / "ir"), str(archive), "--min-elements", "4096"])
    assert archive.stat().st_size < 40_000  # the 2 matrices (224 KiB of random floats) do not travel
    skeleton.main(["unpack", str(archive), str(tmp_path / "out")])
    out = tmp_path / "out"
    assert (out / "openvino_model.xml").read_bytes() == (tmp_path / "ir" / "openvino_model.xml").read_bytes()
    assert (out / "openvino_tokenizer.xml").exists() and not (out / "skeleton.json").exists()
    original, restored = (
        (tmp_path / "ir" / "openvino_model.bin").read_bytes(),
        (out / "openvino_model.bin").read_bytes(),
    )
    assert len(restored) == len(original)
    for name in ("norm", "shape", "rope"):  # 1-D, integer, or below --min-elements: byte for byte
        offset, blob = layout[name]
        assert restored[offset : offset + len(blob)] == blob, name
    assert restored[:8] == original[:8]  # padding too
    for name in ("embed", "proj"):
        offset, blob = layout[name]
        drawn = np.frombuffer(restored[offset : offset + len(blob)], np.float32)
        assert restored[offset : offset + len(blob)] != blob, name
        assert abs(drawn.std() - 0.02) < 0.002 and abs(drawn.mean()) < 0.002, name
    skeleton.main(["unpack", str(archive), str(tmp_path / "again")])  # a fixed seed: the same weights
    assert (tmp_path / "again" / "openvino_model.bin").read_bytes() == restored
