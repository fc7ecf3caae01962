"""The %%ranks cell magic."""
import pytest
from IPython.core.interactiveshell import InteractiveShell

from course_utils.runtime.magics import ranks


def test_ranks_returns_result_by_rank():
    assert ranks("4", "result = rank * 10 + world_size") == [4, 14, 24, 34]


def test_cell_sees_the_notebook_namespace_and_collectives():
    cell = "t = torch.tensor([base + rank]); dist.all_reduce(t); result = t.item()"
    assert ranks("3", cell, {"base": 1.0}) == [6.0, 6.0, 6.0]


def test_result_defaults_to_none_and_outer_result_is_not_leaked():
    assert ranks("2", "x = 1", {"result": "stale"}) == [None, None]


def test_options_are_parsed():
    assert ranks("2 --backend gloo --timeout 20", "result = dist.get_backend()") == ["gloo", "gloo"]


@pytest.mark.parametrize("line", ["", "four", "2 --backend mpi", "2 --bogus 1"])
def test_bad_usage_is_a_clear_error(line):
    with pytest.raises(ValueError, match="usage: %%ranks N"):
        ranks(line, "result = 1")


def test_magic_is_registered_on_import_and_sets_result():
    import course_utils

    ip = InteractiveShell.instance()
    ip.magics_manager.magics["cell"].pop("ranks", None)
    course_utils._autoregister()  # what `import course_utils` runs in a fresh kernel
    ip.user_ns["scale"] = 3
    ip.run_cell_magic("ranks", "2", "result = (rank + 1) * scale")
    assert ip.user_ns["result"] == [3, 6]


def test_load_ext_registers_the_magic():
    ip = InteractiveShell.instance()
    ip.magics_manager.magics["cell"].pop("ranks", None)
    ip.run_line_magic("load_ext", "course_utils")
    assert "ranks" in ip.magics_manager.magics["cell"]
