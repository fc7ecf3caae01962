"""course.widgets.bundle: one mime bundle for a course widget on ipywidgets 7 and 8.

Both paths are tested in this one environment: the installed ipywidgets for its own,
and a stand-in with ipywidgets 7's interface (no ``_repr_mimebundle_``; displayed through
``_ipython_display_``, which sends the view reference and then calls
``_handle_displayed``). tests/colab runs the real ipywidgets 7.7.1.
"""
import ipywidgets
import pytest

from course_utils.course import widgets

VIEW = widgets.VIEW_MIME


class Widget7:
    """What bundle() may use of an ipywidgets 7 DOM widget."""

    _view_name = "VBoxView"
    _model_id = "abc123"

    def __init__(self):
        self.displayed = 0

    def _handle_displayed(self, **kwargs):
        self.displayed += 1


def test_ipywidgets_7_gets_the_view_reference_and_its_displayed_callback():
    w = Widget7()
    b = widgets.bundle(w, "the text form", {"image/png": "iVBOR"})
    assert b == {VIEW: {"version_major": 2, "version_minor": 0, "model_id": "abc123"},
                 "image/png": "iVBOR", "text/plain": "the text form"}
    assert w.displayed == 1


def test_the_installed_ipywidgets_gets_its_own_view_reference():
    box = ipywidgets.VBox([ipywidgets.HTML("x")])
    b = widgets.bundle(box, "text")
    assert b[VIEW]["model_id"] == box.model_id and b["text/plain"] == "text"
    assert widgets.ipywidgets_major() == int(ipywidgets.__version__.split(".")[0])


def test_without_ipywidgets_only_the_static_form():
    assert widgets.bundle(None, "t", {"image/png": "p"}) == {"image/png": "p", "text/plain": "t"}


def test_the_text_form_must_be_text():
    with pytest.raises(TypeError, match="text must be a str"):
        widgets.bundle(None, 3)
