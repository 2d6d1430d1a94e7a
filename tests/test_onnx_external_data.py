"""The external-data files of ONNX models (tensors kept beside the ``.onnx``): found wherever a tensor can
sit, compared with the ``onnx`` package's own listing, and counted in the digest ``detens cache`` records
of a member's weights."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from detens.adapters.onnx_external_data import external_data_files
from detens.jobs._inputs import path_digest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.external_data_helper import set_external_data  # noqa: E402

SIZE = 16  # elements of every tensor


def tensor(name: str, value: float = 1.0) -> TensorProto:
    return numpy_helper.from_array(np.full((1, SIZE), value, np.float32), name)


def value_info(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, SIZE])


def small_model() -> onnx.ModelProto:
    """``y = x + w + (c if cond else the subgraph's t)``: an initializer, a constant node's attribute tensor
    and a subgraph's initializer, each big enough to be saved as external data."""
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["t"], ["t_out"])],
        "then",
        [],
        [value_info("t_out")],
        [tensor("t", 2.0)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"])], "else", [], [value_info("c_out")]
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], value=tensor("c_value", 3.0)),
        helper.make_node("If", ["cond"], ["branch"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Add", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "branch"], ["y"]),
    ]
    cond = numpy_helper.from_array(np.array(True), "cond")
    graph = helper.make_graph(nodes, "small", [value_info("x")], [value_info("y")], [tensor("w"), cond])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_with_external_data(model: onnx.ModelProto, path: Path, one_file: bool = False) -> Path:
    """``model`` saved at ``path`` with every tensor in external data (one file each, or one for all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=one_file,
        location="tensors.bin" if one_file else None,
        size_threshold=0,
        convert_attribute=True,
    )
    return path


def onnx_listing(path: Path) -> set[str]:
    """The external-data locations the ``onnx`` package finds in the model at ``path``."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    model = onnx.load(path, load_external_data=False)
    return {ExternalDataInfo(t).location for t in _get_all_tensors(model) if uses_external_data(t)}


def mark_external(proto: TensorProto, location: str) -> None:
    set_external_data(proto, location)
    proto.data_location = TensorProto.EXTERNAL


# ---------------------------------------------------------------------------------------------- the files
class TestExternalDataFiles:
    def test_the_files_onnx_itself_lists(self, tmp_path):
        path = save_with_external_data(small_model(), tmp_path / "model" / "small.onnx")
        found = external_data_files(path)
        assert {f.name for f in found} == onnx_listing(path) == {"w", "cond", "t", "c_value"}
        assert all(f.parent == path.parent and f.is_file() for f in found)

    def test_one_file_for_all_tensors_is_listed_once(self, tmp_path):
        path = save_with_external_data(small_model(), tmp_path / "small.onnx", one_file=True)
        assert external_data_files(path) == [tmp_path / "tensors.bin"]

    def test_a_model_that_holds_its_tensors_names_no_file(self, tmp_path):
        path = tmp_path / "small.onnx"
        onnx.save_model(small_model(), path)
        assert external_data_files(path) == []

    @pytest.mark.parametrize("where", ["sparse_initializer", "function_attribute", "attribute_tensors"])
    def test_tensors_where_onnx_does_not_look(self, tmp_path, where):
        """onnx's own listing passes over these; onnxruntime reads them all the same."""
        model = small_model()
        if where == "sparse_initializer":
            values = numpy_helper.from_array(np.ones(SIZE, np.float32), "s_values")
            indices = numpy_helper.from_array(np.arange(SIZE, dtype=np.int64), "s_indices")
            mark_external(values, "sparse.bin")
            model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [1, 4 * SIZE]))
        elif where == "function_attribute":
            constant = tensor("f_value")
            mark_external(constant, "function.bin")
            node = helper.make_node("Constant", [], ["f_out"], value=constant)
            function = helper.make_function(
                "local", "f", [], ["f_out"], [node], [helper.make_opsetid("", 17)]
            )
            model.functions.append(function)
        else:
            listed = [tensor("a"), tensor("b")]
            mark_external(listed[1], "listed.bin")
            model.graph.node.append(helper.make_node("Custom", [], ["z"], domain="custom", values=listed))
        path = tmp_path / "model.onnx"
        path.write_bytes(model.SerializeToString())
        expected = {"sparse_initializer": "sparse.bin", "function_attribute": "function.bin"}
        assert external_data_files(path) == [tmp_path / expected.get(where, "listed.bin")]

    def test_a_location_on_a_tensor_not_marked_external_is_not_a_file(self, tmp_path):
        model = small_model()
        set_external_data(model.graph.initializer[0], "stale.bin")
        model.graph.initializer[0].data_location = TensorProto.DEFAULT  # its data is the raw_data it holds
        path = tmp_path / "model.onnx"
        path.write_bytes(model.SerializeToString())
        assert external_data_files(path) == []

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            (b"", "is empty, not an ONNX model"),
            (b"\x0f" * 8, "is not an ONNX model: wire type 7"),
            (b"\x3a\xff\x01", "is not an ONNX model: field 7"),
        ],
    )
    def test_not_a_model(self, tmp_path, content, message):
        path = tmp_path / "model.onnx"
        path.write_bytes(content)
        with pytest.raises(ValueError, match=message):
            external_data_files(path)

    def test_an_empty_location(self, tmp_path):
        model = small_model()
        mark_external(model.graph.initializer[0], "")
        path = tmp_path / "model.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(
            ValueError, match=r"model\.onnx keeps a tensor in external data without naming the file"
        ):
            external_data_files(path)


# ------------------------------------------------------------------------------------------------ digests
class TestDigest:
    def test_a_model_that_holds_its_tensors_is_the_digest_of_its_file(self, tmp_path):
        path = tmp_path / "small.onnx"
        onnx.save_model(small_model(), path)
        assert path_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()[:16]

    def test_external_data_counts_and_the_place_does_not(self, tmp_path):
        path = save_with_external_data(small_model(), tmp_path / "a" / "small.onnx")
        digest = path_digest(path)
        shutil.copytree(path.parent, tmp_path / "b")
        assert path_digest(tmp_path / "b" / "small.onnx") == digest
        (path.parent / "w").write_bytes(
            numpy_helper.to_array(tensor("w", 5.0)).tobytes()
        )  # retrained weights
        assert path_digest(path) != digest

    def test_a_missing_external_data_file_is_named(self, tmp_path):
        path = save_with_external_data(small_model(), tmp_path / "small.onnx")
        (tmp_path / "cond").unlink()
        with pytest.raises(
            FileNotFoundError, match=rf"small\.onnx keeps tensors in {tmp_path / 'cond'}, which is not a file"
        ):
            path_digest(path)
