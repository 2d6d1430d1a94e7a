"""The catalogue's names, which the help pages show without importing torch, are the registries' own."""

from detens import catalogue


def test_the_fusers_are_the_registered_ones():
    from detens.fusers import FUSERS, list_methods

    assert list(catalogue.FUSERS) == FUSERS.names()
    assert list(catalogue.FUSION_METHODS) == list_methods()


def test_the_head_types_are_the_registered_ones():
    from detens.heads import HEADS, TRAINERS
    from detens.jobs.train import HEAD_TYPES

    assert list(catalogue.HEAD_TYPES) == HEADS.names()
    assert list(catalogue.TRAINED_HEAD_TYPES) == sorted(TRAINERS) == HEAD_TYPES


def test_the_evaluation_methods_are_the_registered_ones():
    from detens.evaluation import METHODS

    assert list(catalogue.EVALUATION_METHODS) == METHODS.names()
