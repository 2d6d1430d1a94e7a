from __future__ import annotations

import numpy as np
import pytest
import torch

from detens.detections import Detections
from detens.export import save_yolo_txt, yolo_lines
from detens.visualize import class_color, draw_detections, draw_ground_truth


def dets():
    # 200 x 100 image (h, w); the second box sticks out of the image and is clipped
    return Detections(
        [[10.0, 20.0, 30.0, 60.0], [90.0, 150.0, 120.0, 220.0], [0.0, 0.0, 5.0, 5.0]],
        [0.5, 0.9, 0.1],
        [1, 90, 6],
        (200, 100),
    )


class TestYoloLines:
    def test_values_order_and_clipping(self):
        lines = yolo_lines(dets(), decimals=4)
        # toothbrush (id 90) is YOLO class 79; its box is clipped to x <= 100, y <= 200
        assert lines[0] == "79 0.9500 0.8750 0.1000 0.2500 0.9000"
        # person: cx 20/100, cy 40/200, w 20/100, h 40/200
        assert lines[1] == "0 0.2000 0.2000 0.2000 0.2000 0.5000"
        assert lines[2].startswith("5 ")  # bus (id 6) is YOLO class 5

    def test_boxes_outside_the_image_have_no_line(self):
        outside = Detections([[700.0, 10.0, 720.0, 20.0], [10.0, 250.0, 20.0, 260.0], [99.0, 10.0, 130.0, 20.0]],
                             [0.9, 0.8, 0.7], [1, 1, 1], (200, 100))
        assert yolo_lines(outside, decimals=3) == ["0 0.995 0.075 0.010 0.050 0.700"]  # the last: 1 pixel inside

    def test_conf_and_custom_label_space(self):
        assert len(yolo_lines(dets(), conf=0.4)) == 2
        lines = yolo_lines(dets()[[0]], category_ids=[7, 1])
        assert lines[0].split()[0] == "1"
        with pytest.raises(ValueError, match="label 90 is not in"):
            yolo_lines(dets(), category_ids=[1, 6])

    def test_empty_and_file(self, tmp_path):
        assert yolo_lines(Detections.empty((5, 5))) == []
        path = save_yolo_txt(tmp_path / "sub" / "a b.txt", Detections.empty((5, 5)))
        assert path.read_text() == ""
        save_yolo_txt(path, dets(), conf=0.4)
        assert len(path.read_text().splitlines()) == 2


    @pytest.mark.parametrize("options, error, message", [
        ({"decimals": -1}, ValueError, "decimals must be an integer >= 0, got -1"),
        ({"decimals": 2.5}, TypeError, "decimals must be an integer, got float: 2.5"),
        ({"conf": "0.5"}, TypeError, "conf must be a number, got str: '0.5'"),
        ({"conf": float("nan")}, ValueError, r"conf must be in \[0, 1\], got nan"),
        ({"conf": 1.5}, ValueError, r"conf must be in \[0, 1\], got 1.5"),
        ({"category_ids": [1, 1, 6, 90]}, ValueError, "category_ids maps classes 0 and 1 to one label 1"),
        ({"category_ids": [1, "6", 90]}, TypeError, r"category_ids\[1\] must be an integer, got str"),
        ({"category_ids": "1690"}, TypeError, "category_ids must be a list of integers, got str"),
        ({"category_ids": [1, 6.5, 90]}, ValueError, r"category_ids\[1\] must be a whole number, got 6.5"),
        ({"category_ids": [1, 6, float("nan")]}, ValueError, r"category_ids\[2\] must be a whole number, got nan"),
        ({"category_ids": [1, True, 90]}, TypeError, r"category_ids\[1\] must be an integer, got bool"),
        ({"category_ids": [1, -6, 90]}, ValueError, r"category_ids\[1\] must be an integer in \[0, \d+\], got -6"),
        ({"category_ids": {0: 1, 1: 6, 2: 90}}, TypeError, "category_ids must be a list of integers, got dict"),
        ({"category_ids": np.array([[1, 6, 90]])}, ValueError, r"category_ids must be a flat list .*shape \[1, 3\]"),
    ])
    def test_bad_options_are_named(self, options, error, message):
        with pytest.raises(error, match=message):
            yolo_lines(dets(), **options)

    @pytest.mark.parametrize("category_ids", [
        [1.0, 6.0, 90.0],
        [1, np.float32(6.0), np.int64(90)],
        np.array([1.0, 6.0, 90.0]),
        np.array([1.0, 6.0, 90.0], dtype=">f4"),
        np.array([1, 6, 90], dtype=">i8"),
        torch.tensor([1.0, 6.0, 90.0]),
    ], ids=["floats", "numpy scalars", "float array", "big-endian floats", "big-endian ints", "tensor"])
    def test_whole_number_category_ids_are_the_ids_they_hold(self, category_ids):
        """Ids read from a float array (3.0), as detens.convert and Detections' labels take them."""
        assert yolo_lines(dets(), category_ids=category_ids) == yolo_lines(dets(), category_ids=[1, 6, 90])
        assert len(yolo_lines(dets(), category_ids=[1, 6, 90])) == 3

    def test_det_must_be_detections(self, tmp_path):
        with pytest.raises(TypeError, match="det must be Detections, got ndarray"):
            yolo_lines(np.array([[1.0, 1.0, 5.0, 5.0]]))
        with pytest.raises(TypeError, match="det must be Detections, got list"):
            save_yolo_txt(tmp_path / "a.txt", [[1.0, 1.0, 5.0, 5.0]])
        assert list(tmp_path.iterdir()) == []

    def test_a_folder_as_the_file_is_named(self, tmp_path):
        with pytest.raises(IsADirectoryError, match=f"is a folder; give the path of a file to write: '{tmp_path}'"):
            save_yolo_txt(tmp_path, dets())
        assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file left behind


class TestDraw:
    def test_draws_a_copy(self):
        image = np.zeros((200, 100, 3), np.uint8)
        drawn = draw_detections(image, dets(), {1: "person", 90: "toothbrush", 6: "bus"}, line_width=1)
        assert image.max() == 0 and drawn.shape == image.shape and drawn.dtype == np.uint8
        assert tuple(int(v) for v in drawn[40, 10]) == class_color(1)  # left edge of the person box
        assert drawn[100:199, 40:85].max() == 0  # empty area untouched

    def test_conf_hides_boxes_and_empty(self):
        image = np.zeros((200, 100, 3), np.uint8)
        assert draw_detections(image, dets(), conf=0.95).max() == 0
        np.testing.assert_array_equal(draw_detections(image, Detections.empty((200, 100))), image)

    def test_names_as_a_list_of_positions(self):
        image = np.zeros((200, 100, 3), np.uint8)
        names = ["bg", "person", "bicycle", "car", "motorcycle", "airplane", "bus"]  # positions are the labels
        by_list = draw_detections(image, dets(), names, line_width=1)
        by_dict = draw_detections(image, dets(), dict(enumerate(names)), line_width=1)
        np.testing.assert_array_equal(by_list, by_dict)
        with pytest.raises(TypeError, match="names must be a dict {label: name} or a list of names, got str"):
            draw_detections(image, dets(), "person")

    @pytest.mark.parametrize("names, message", [
        (["bg", "person", True, "car"], "got bool True for label 2"),  # `- yes` in a YAML list of names
        ({1: "person", 6: None}, "got NoneType None for label 6"),  # `6: ~`
        ({1: "person", 3: 7}, "got int 7 for label 3"),
    ])
    def test_names_that_are_not_strings_are_refused(self, names, message):
        image = np.zeros((200, 100, 3), np.uint8)
        with pytest.raises(TypeError, match=f"names must map each label to a string, {message}"):
            draw_detections(image, dets(), names)

    @pytest.mark.parametrize("image, options, error, message", [
        (np.zeros((200, 100, 3), np.float32), {}, TypeError, "image_bgr must be a uint8 BGR array .* got dtype float32"),
        (np.zeros((200, 100, 3), np.uint8), {"line_width": -3}, ValueError, "line_width must be an integer >= 1, got -3"),
        (np.zeros((200, 100, 3), np.uint8), {"line_width": 0}, ValueError, "line_width must be an integer >= 1, got 0"),
        (np.zeros((200, 100, 3), np.uint8), {"line_width": 1.5}, TypeError, "line_width must be an integer, got float"),
        (np.zeros((200, 100, 3), np.uint8), {"conf": float("nan")}, ValueError, r"conf must be in \[0, 1\], got nan"),
    ])
    def test_bad_inputs_are_named(self, image, options, error, message):
        with pytest.raises(error, match=message):
            draw_detections(image, dets(), **options)

    def test_size_mismatch(self):
        with pytest.raises(ValueError, match="detections are for"):
            draw_detections(np.zeros((10, 10, 3), np.uint8), dets())


class TestDrawGroundTruth:
    def test_dashed_white_on_black_along_the_border_only(self):
        image = np.full((100, 120, 3), 128, np.uint8)
        drawn = draw_ground_truth(image, np.array([[20.0, 30.0, 100.0, 80.0]]), line_width=1, dash=5)
        assert (image == 128).all()  # a copy
        top = drawn[30, 20:101]  # the top edge: dashes of white and gaps left as they were
        white = (top == 255).all(axis=1)
        assert 0.3 < white.mean() < 0.7  # dashed, not solid
        assert (drawn[29, 20:101] == 0).all(axis=1).any()  # the black outline beside the dash
        assert (drawn[40:70, 30:90] == 128).all()  # the inside untouched
        assert (drawn[:25, :] == 128).all() and (drawn[86:, :] == 128).all()  # outside untouched

    def test_boxes_outside_are_clipped_and_none_is_a_copy(self):
        image = np.zeros((50, 60, 3), np.uint8)
        np.testing.assert_array_equal(draw_ground_truth(image, np.zeros((0, 4))), image)
        drawn = draw_ground_truth(image, np.array([[-10.0, -10.0, 200.0, 200.0]]), line_width=1)
        assert drawn[0].max() == 255 and drawn[49].max() == 255  # drawn on the image's own edges
        with pytest.raises(ValueError, match=r"BGR array \[H, W, 3\]"):
            draw_ground_truth(np.zeros((5, 5)), np.zeros((0, 4)))
        with pytest.raises(TypeError, match="got dtype float64"):
            draw_ground_truth(np.zeros((5, 5, 3)), np.zeros((0, 4)))
        with pytest.raises(ValueError, match="line_width must be an integer >= 1, got 0"):
            draw_ground_truth(image, np.zeros((0, 4)), line_width=0)
        with pytest.raises(ValueError, match="dash must be an integer >= 1, got 0"):
            draw_ground_truth(image, np.zeros((0, 4)), dash=0)

    @pytest.mark.parametrize("boxes, message", [
        ([[5.0, 5.0, float("nan"), 20.0]], r"boxes\[0\] is not finite: \[5\.0, 5\.0, nan, 20\.0\]"),
        ([[1, 1, 2, 2], [5, 5, float("inf"), 20]], r"boxes\[1\] is not finite"),
        ([[5, 5, 20, 20, 0.9]], r"boxes must have shape \[G, 4\] \(x1, y1, x2, y2 per box\), got \[1, 5\]"),
        ([5, 5, 20, 20, 6, 6, 30, 30], r"boxes must have shape \[G, 4\] .*got \[8\]"),
        ([[20, 5, 5, 20]], r"boxes\[0\] = \[20\.0, 5\.0, 5\.0, 20\.0\] has x2 < x1 or y2 < y1"),
    ], ids=["nan", "inf", "a score column", "a flat list", "xywh-like"])
    def test_boxes_that_are_not_g_by_4_finite_xyxy_are_named(self, boxes, message):
        # a NaN box used to become INT_MIN pixels and a dash loop over billions of them
        with pytest.raises(ValueError, match=message):
            draw_ground_truth(np.zeros((50, 60, 3), np.uint8), boxes)
        with pytest.raises(TypeError, match=r"boxes must be an array \[G, 4\] of xyxy numbers, got list"):
            draw_ground_truth(np.zeros((50, 60, 3), np.uint8), [["a", 1, 2, 3]])
        np.testing.assert_array_equal(draw_ground_truth(np.zeros((5, 5, 3), np.uint8), []), np.zeros((5, 5, 3)))

    def test_draw_detections_takes_detections(self):
        with pytest.raises(TypeError, match="det must be Detections, got ndarray"):
            draw_detections(np.zeros((200, 100, 3), np.uint8), np.array([[1.0, 1.0, 5.0, 5.0]]))
