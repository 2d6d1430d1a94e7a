from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from detens import Detections

GOOD = dict(boxes=[[0, 0, 10, 10], [5, 5, 8, 9]], scores=[0.9, 0.1], labels=[1, 3], image_size=(20, 30))


def make(**changes):
    kwargs = dict(GOOD)
    kwargs.update(changes)
    return Detections(**kwargs)


class TestConstruction:
    def test_converts_lists_and_numpy(self):
        det = make(boxes=np.array(GOOD["boxes"], dtype=np.float64), labels=np.array([1, 3], dtype=np.int32))
        assert det.boxes.dtype == torch.float32
        assert det.labels.dtype == torch.int64
        assert det.image_size == (20, 30)
        assert len(det) == 2

    def test_does_not_modify_the_callers_tensor(self):
        boxes = torch.tensor(GOOD["boxes"], dtype=torch.float64)
        det = make(boxes=boxes)
        det.clip().boxes.add_(1)
        assert torch.equal(boxes, torch.tensor(GOOD["boxes"], dtype=torch.float64))

    def test_inputs_of_the_target_dtype_are_shared_others_copied(self):
        """What the class docstring promises: float32 boxes and scores and int64 labels are used as they
        are (as torch.as_tensor does); anything else is converted into a fresh tensor."""
        shared = {"boxes": np.array(GOOD["boxes"], np.float32), "scores": torch.tensor([0.5, 0.6]),
                  "labels": np.array([1, 3], np.int64)}
        det = make(**shared)
        for name, given in shared.items():
            assert np.shares_memory(getattr(det, name).numpy(), np.asarray(given)), name
        copied = {"boxes": np.array(GOOD["boxes"], np.float64), "scores": torch.tensor([0.5, 0.6], dtype=torch.float64),
                  "labels": np.array([1, 3], np.int32)}
        det = make(**copied)
        for name, given in copied.items():
            assert not np.shares_memory(getattr(det, name).numpy(), np.asarray(given)), name

    @pytest.mark.parametrize("field", ["boxes", "scores", "labels"])
    def test_read_only_arrays_are_copied_without_a_warning(self, field):
        """``np.frombuffer`` (as inference servers' clients return outputs) and read-only memory maps: torch
        would wrap such an array in a writable tensor, warning that writing into it is undefined."""
        dtype = np.int64 if field == "labels" else np.float32  # the dtype an array is shared in
        given = np.frombuffer(np.array(GOOD[field], dtype=dtype).tobytes(), dtype=dtype).reshape(np.shape(GOOD[field]))
        assert not given.flags.writeable
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            det = make(**{field: given})
        assert getattr(det, field).tolist() == getattr(make(), field).tolist()
        assert not np.shares_memory(getattr(det, field).numpy(), given)

    @pytest.mark.parametrize("field, dtype", [
        ("boxes", ">f4"), ("boxes", ">f8"), ("scores", ">f4"), ("scores", ">f8"), ("labels", ">i8"),
        ("labels", ">i4"), ("labels", ">u2"), ("labels", ">f4"),
    ])
    def test_arrays_of_the_other_byte_order_hold_the_same_values(self, field, dtype):
        """A big-endian array (as some file formats store numbers) is the same detections as a native one;
        torch cannot wrap it, so it is converted, never refused."""
        given = np.array(GOOD[field]).astype(dtype)
        det = make(**{field: given})
        reference = make(**{field: given.astype(given.dtype.newbyteorder("="))})
        for name in ("boxes", "scores", "labels"):
            got, expected = getattr(det, name), getattr(reference, name)
            assert got.dtype == expected.dtype and torch.equal(got, expected), name
        assert np.array_equal(given, np.array(GOOD[field]).astype(dtype)) and given.dtype == np.dtype(dtype)  # untouched

    @pytest.mark.parametrize("field", ["boxes", "scores", "labels"])
    def test_arrays_read_backwards_hold_the_same_values(self, field):
        """``a[::-1]``, ``np.flip`` and ``np.argsort(s)[::-1]`` give negative strides, which torch cannot
        wrap: converted like any other layout, never refused."""
        given = np.array(GOOD[field])[::-1].copy()[::-1]  # GOOD's values, read backwards from memory
        assert given.strides[0] < 0
        det = make(**{field: given})
        reference = make(**{field: np.ascontiguousarray(given)})
        for name in ("boxes", "scores", "labels"):
            assert torch.equal(getattr(det, name), getattr(reference, name)), name

    def test_float64_beyond_float32_is_named_as_given(self):
        """A finite float64 too large for float32 would become inf; the error shows the number passed."""
        with pytest.raises(ValueError, match=r"boxes\[1, 2\] = 1e\+39 is beyond float32's range"):
            make(boxes=np.array([[0, 0, 10, 10], [5, 5, 1e39, 9]]))
        with pytest.raises(ValueError, match=r"scores\[0\] = -1e\+40 is beyond float32's range"):
            make(scores=torch.tensor([-1e40, 0.5], dtype=torch.float64))

    @pytest.mark.parametrize("field", ["boxes", "scores", "labels"])
    @pytest.mark.parametrize("num_boxes", [0, 2])
    def test_a_field_on_the_meta_device_is_named(self, field, num_boxes):
        """A meta tensor holds no values: the other fields would be moved onto it, or a torch copy or check
        would fail naming no field."""
        given = {name: torch.as_tensor(GOOD[name])[:num_boxes] for name in ("boxes", "scores", "labels")}
        given[field] = given[field].to("meta")
        with pytest.raises(ValueError, match=f"Detections.{field} is on the meta device, which holds shapes but no"):
            make(**given)

    def test_bad_values_in_the_other_byte_order_are_named(self):
        with pytest.raises(ValueError, match=r"labels\[1\] = 1.5 is not an integer class id"):
            make(labels=np.array([1.0, 1.5], dtype=">f8"))
        with pytest.raises(ValueError, match=r"scores\[0\] = 2.0 is outside \[0, 1\]"):
            make(scores=np.array([2.0, 0.5], dtype=">f4"))

    def test_empty(self):
        det = Detections.empty((4, 5))
        assert len(det) == 0 and det.boxes.shape == (0, 4) and det.labels.dtype == torch.int64
        assert len(make(boxes=[], scores=[], labels=[])) == 0

    @pytest.mark.parametrize(
        "changes, error, fragment",
        [
            (dict(boxes=[[0, 0, 10]] * 2), ValueError, "boxes must have shape [K, 4]"),
            (dict(scores=[0.9]), ValueError, "scores must have shape [K] = [2]"),
            (dict(labels=[1, 2, 3]), ValueError, "labels must have shape"),
            (dict(boxes=[[0, 0, 10, 10], [5, 5, float("nan"), 9]]), ValueError, "boxes[1] is not finite"),
            (dict(boxes=[[0, 0, 10, 10], [5, 5, float("inf"), 9]]), ValueError, "boxes[1] is not finite"),
            (dict(boxes=[[10, 0, 0, 10], [5, 5, 8, 9]]), ValueError, "boxes[0] = [10.0, 0.0, 0.0, 10.0] has x2 < x1"),
            (dict(scores=[0.9, 1.2]), ValueError, "scores[1] = 1.2"),
            (dict(scores=[-0.1, 0.5]), ValueError, "scores[0]"),
            (dict(labels=[1, -1]), ValueError, "labels[1] = -1 is not an integer class id in [0, 2147483647]"),
            (dict(labels=[1.5, 2]), ValueError, "labels[0] = 1.5"),
            (dict(labels=[1, float("nan")]), ValueError, "labels[1] = nan"),
            # would become a negative int64 (inf, 1e30) or another id (above 2**53) if converted
            (dict(labels=[1, float("inf")]), ValueError, "labels[1] = inf"),
            (dict(labels=[1e30, 2]), ValueError, "labels[0] = 1e+30"),
            (dict(labels=torch.tensor([1, 2**53 + 1])), ValueError, "labels[1] = 9007199254740993"),
            (dict(labels=torch.tensor([2**31, 1])), ValueError, "labels[0] = 2147483648"),
            (dict(labels=np.array([2.0**31, 1.0], dtype=np.float32)), ValueError, "labels[0] = 2147483648.0"),
            (dict(image_size=(0, 30)), ValueError, "image_size must be positive"),
            (dict(image_size=(20, 2**31)), ValueError, "at most 2147483647 pixels, got (20, 2147483648)"),
            (dict(image_size=(20,)), ValueError, "image_size must be (height, width)"),
            (dict(image_size=(True, 30)), TypeError, "image_size must hold integers"),
            (dict(image_size=(20.5, 30)), TypeError, "image_size must hold integers"),
            (dict(boxes="abc"), TypeError, "boxes must be"),
            (dict(labels=[True, False]), TypeError,
             "labels must hold integer class ids (an integer or floating-point dtype), got dtype torch.bool"),
            (dict(labels=torch.tensor([True, False])), TypeError, "labels must hold integer class ids"),
            (dict(boxes=torch.ones(2, 4, dtype=torch.bool)), TypeError,
             "boxes must hold real numbers (an integer or floating-point dtype), got dtype torch.bool"),
            (dict(scores=np.array([0.5, 0.5], dtype=np.complex64)), TypeError,
             "scores must hold real numbers (an integer or floating-point dtype), got dtype torch.complex64"),
            (dict(source=3), TypeError, "source must be a string or None, got int: 3"),
        ],
    )
    def test_bad_input_names_the_offender(self, changes, error, fragment):
        with pytest.raises(error) as info:
            make(**changes)
        assert fragment in str(info.value)

    @pytest.mark.parametrize(
        "labels",
        [[0, 2**31 - 1], np.array([0, 2**31 - 1], dtype=np.int64), np.array([0.0, 2.0**31 - 1]), [1.0, -0.0]],
    )
    def test_label_range_ends_are_kept_exactly(self, labels):
        det = make(labels=labels)
        assert det.labels.dtype == torch.int64 and det.labels.tolist() == [int(v) for v in labels]

    @pytest.mark.parametrize(
        "dtype", [np.int8, np.int16, np.uint16, np.uint32, np.uint64, torch.int8, torch.uint16, torch.uint64]
    )
    def test_labels_of_any_integer_dtype(self, dtype):
        """Small signed ints once compared with a wrapped MAX_LABEL (every label refused) and unsigned
        ones above uint8 have no comparison kernels; the range check must not depend on the dtype."""
        as_array = np.array if isinstance(dtype, type) else torch.tensor
        assert make(labels=as_array([1, 3], dtype=dtype)).labels.tolist() == [1, 3]
        if dtype in (np.uint64, torch.uint64):
            with pytest.raises(ValueError, match=r"labels\[1\] = 9223372036854775813 is not an integer class id"):
                make(labels=as_array([1, 2**63 + 5], dtype=dtype))
        elif dtype in (np.int8, torch.int8):
            with pytest.raises(ValueError, match=r"labels\[1\] = -3 is not an integer class id"):
                make(labels=as_array([1, -3], dtype=dtype))

    def test_with_source_checks_the_name(self):
        assert make().with_source("m").source == "m"
        with pytest.raises(TypeError, match="source must be a string or None"):
            make().with_source(["m"])


class TestProtocol:
    def test_indexing(self):
        det = make()
        assert len(det[torch.tensor([False, True])]) == 1
        assert det[1].scores.tolist() == pytest.approx([0.1])
        assert det[-1].labels.tolist() == [3]
        assert det[[1, 0]].labels.tolist() == [3, 1]
        assert len(det[det.scores > 2]) == 0
        with pytest.raises(IndexError):
            det[torch.tensor([True])]
        assert det[np.int64(-2)].labels.tolist() == [1]

    def test_indexing_matches_a_list_of_the_boxes(self):
        det = make(boxes=[[0, 0, 5, 5], [1, 1, 6, 6], [2, 2, 7, 7]], scores=[0.2, 0.9, 0.5], labels=[4, 5, 6])
        rows = list(zip(det.boxes.tolist(), det.scores.tolist(), det.labels.tolist(), strict=True))

        def picked(sub):
            return list(zip(sub.boxes.tolist(), sub.scores.tolist(), sub.labels.tolist(), strict=True))

        for index, positions in [
            (det.scores.argmax(), [1]),  # a 0-d tensor is one box, like an int
            (np.array(2), [2]),
            ([], []),
            (np.array([], dtype=np.int64), []),
            (slice(None, None, -1), [2, 1, 0]),
            (slice(2, None, -2), [2, 0]),
            (torch.tensor([2, 0, 2]), [2, 0, 2]),
            (np.array([1, 1, 0], dtype=np.uint8), [1, 1, 0]),  # indices, not a mask of uint8
            (torch.tensor([0, 2], dtype=torch.uint8), [0, 2]),
            (torch.tensor([2, 1], dtype=torch.int32), [2, 1]),
            (np.array([2], dtype=np.int16), [2]),
            (np.array([2, 0], dtype=">i8"), [2, 0]),  # the other byte order: the same indices
            (np.array(1, dtype=">i4"), [1]),
            (np.argsort(det.scores.numpy())[::-1], [1, 2, 0]),  # best first: negative strides
        ]:
            sub = det[index]
            assert picked(sub) == [rows[i] for i in positions], index
            assert sub.boxes.shape == (len(positions), 4) and sub.scores.shape == (len(positions),)

    @pytest.mark.parametrize(
        "index, error, fragment",
        [
            ([0.5], TypeError, "integers or a boolean mask, got dtype torch.float64"),
            (torch.tensor(1.0), TypeError, "integers or a boolean mask"),
            (torch.tensor([[0, 1]]), IndexError, r"one-dimensional, got shape \[1, 2\]"),
            ("0", TypeError, "got str"),
            (None, TypeError, "got NoneType"),
            (True, TypeError, "got bool"),
            ([[0], [1, 0]], ValueError, "must be flat"),
        ],
    )
    def test_index_of_another_kind_is_an_error(self, index, error, fragment):
        with pytest.raises(error, match=fragment):
            make()[index]

    def test_to_takes_a_device_only(self):
        det = make()
        assert det.to("cpu").device.type == "cpu" and det.to(torch.device("cpu")).labels.dtype == torch.int64
        with pytest.raises(TypeError, match="Detections.to takes a device.*got torch.float16"):
            det.to(torch.float16)

    @pytest.mark.parametrize("device", [3.5, torch.float32, True])
    def test_empty_refuses_what_is_no_device_naming_it(self, device):
        """torch's own error ("zeros(): argument 'device' must be torch.device, not float") named no call."""
        with pytest.raises(TypeError, match=r"^Detections.empty: device must be a device .* or None, got "):
            Detections.empty((4, 5), device=device)
        assert Detections.empty((4, 5), device=None).device.type == "cpu"

    @pytest.mark.parametrize(
        "device, message",
        [
            ("cdua", "must be a torch device: cpu, cuda or cuda:<index>, got 'cdua'"),
            pytest.param(
                "cuda", "is 'cuda' but no CUDA device is available",
                marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
            ),
            pytest.param(
                0, "is 'cuda:0' but no CUDA device is available",
                marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
            ),
            pytest.param(  # a CUDA index as numpy gives it, as an int is taken
                np.int64(0), "is 'cuda:0' but no CUDA device is available",
                marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
            ),
            ("meta", "is 'meta' but this machine has no meta device"),  # torch places tensors there, without values
        ],
    )
    def test_a_device_this_machine_lacks_is_named(self, device, message):
        """torch's own error ("Found no NVIDIA driver on your system") names neither the call nor the argument."""
        with pytest.raises(ValueError, match=f"Detections.to: device {message}"):
            make().to(device)
        with pytest.raises(ValueError, match=f"Detections.empty: device {message}"):
            Detections.empty((4, 5), device=device)

    @pytest.mark.parametrize("index", [2, -3, np.int64(5)])
    def test_integer_index_out_of_range_is_an_error(self, index):
        with pytest.raises(IndexError, match="out of range for 2 boxes"):
            make()[index]

    @pytest.mark.parametrize(
        "size",
        [(20, 30), [20, 30], np.array([20, 30]), torch.tensor([20, 30]), (20.0, 30), tuple(torch.tensor([20, 30])),
         (np.int64(20), np.array(30)), torch.tensor([[20, 30]])[0]],
    )
    def test_image_size_containers(self, size):
        assert make(image_size=size).image_size == (20, 30)

    def test_clip_and_area(self):
        det = make(boxes=[[-5, -5, 40, 10], [5, 5, 8, 9]]).clip()
        assert det.boxes[0].tolist() == [0, 0, 30, 10]
        assert det.area().tolist() == [300, 12]

    def test_concat_and_sort(self):
        det = Detections.concat([make(), make(scores=[0.2, 0.95])])
        assert len(det) == 4
        assert det.sort_by_score().scores.tolist() == pytest.approx([0.95, 0.9, 0.2, 0.1])
        with pytest.raises(ValueError, match="different image sizes"):
            Detections.concat([make(), make(image_size=(5, 5))])
        assert len(Detections.concat(d for d in [make(), make()])) == 4  # a generator is read once

    @pytest.mark.parametrize(
        "items, message",
        [([make(), 5], r"items\[1\] must be Detections, got int"), (make(), "a list of Detections, got Detections"),
         (None, "a list of Detections, got NoneType"), ([], "needs at least one Detections")],
    )
    def test_concat_names_what_is_not_detections(self, items, message):
        with pytest.raises((TypeError, ValueError), match=message):
            Detections.concat(items)

    def test_normalized_boxes(self):
        torch.testing.assert_close(make().normalized_boxes()[0], torch.tensor([0, 0, 10 / 30, 10 / 20]))

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_to_cuda(self):
        det = make().to("cuda")
        assert det.boxes.device.type == det.labels.device.type == "cuda"
        assert det.device.type == "cuda"


def test_check_boxes_inside_refuses_exactly_the_boxes_an_obvious_loop_finds():
    from detens.detections import BOX_SLACK, check_boxes_inside

    generator = torch.Generator().manual_seed(0)
    refused = {"starts beyond": 0, "ends past": 0}
    for _ in range(400):
        height, width = (int(v) for v in torch.randint(1, 60, (2,), generator=generator))
        corners = torch.rand(int(torch.randint(0, 6, (1,), generator=generator)), 2, generator=generator) * 70
        boxes = torch.cat([corners, corners + 1 + torch.rand(len(corners), 2, generator=generator) * 20], 1)
        det = Detections(boxes, torch.full((len(boxes),), 0.5), torch.zeros(len(boxes), dtype=torch.int64),
                         (height, width))
        first_beyond, why = None, None
        for k, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
            if x1 >= width or y1 >= height:
                first_beyond, why = k, "starts beyond"
            elif x2 > width + width * BOX_SLACK + 1 or y2 > height + height * BOX_SLACK + 1:
                first_beyond, why = k, "ends past"
            if first_beyond is not None:
                break
        if first_beyond is None:
            check_boxes_inside(det, "image_size")
        else:
            refused[why] += 1
            with pytest.raises(ValueError, match=rf"^box {first_beyond} .* {why} the {width}x{height}"):
                check_boxes_inside(det, "image_size")
    assert min(refused.values()) > 20, refused  # both kinds were met


def test_a_portrait_image_size_given_as_width_height_is_refused_by_the_boxes_that_end_past_it():
    """Swapped sides of a portrait image leave every box's start inside: only its end tells."""
    from detens.detections import check_boxes_inside

    person = Detections(torch.tensor([[50.0, 400.0, 300.0, 904.6]]), torch.tensor([0.9]), torch.tensor([1]),
                        (810, 1080))  # bus.jpg is 810 wide and 1080 high
    with pytest.raises(ValueError, match=r"^box 0 \[50\.0, 400\.0, 300\.0, 904\.6\] ends past the 1080x810 \(width "
                                         r"x height\) image that image_size=\(810, 1080\) gives; image_size is "
                                         r"\(height, width\) .*; boxes that do run past their image's edges are "
                                         r"clipped to it first$"):
        check_boxes_inside(person, "image_size")
    check_boxes_inside(Detections(person.boxes, person.scores, person.labels, (1080, 810)), "image_size")
    # a box a pixel past the edge, as rounding leaves it, is no sign of a wrong size
    check_boxes_inside(Detections(torch.tensor([[0.0, 0.0, 810.9, 1080.9]]), person.scores, person.labels,
                                  (1080, 810)), "image_size")
