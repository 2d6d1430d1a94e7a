import importlib.metadata
import platform

from detens.jobs import _software
from detens.jobs._software import RECORDED_PACKAGES, software_versions


def test_software_versions_are_the_installed_distributions():
    versions = software_versions()
    assert versions["python"] == platform.python_version()
    for name in RECORDED_PACKAGES:
        try:
            expected = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            assert name not in versions, name
        else:
            assert versions[name] == expected, name
    assert {"detens", "torch", "numpy"} <= set(versions)  # always installed with detens


def test_a_distribution_that_is_not_installed_is_left_out(monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name == "openvino":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(_software.metadata, "version", version)
    versions = software_versions()
    assert "openvino" not in versions and versions["torch"] == real("torch")
