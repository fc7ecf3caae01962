"""The grader of appendix 10's exercise: the rows of dim 0 each rank owns under FSDP2."""
from course_utils.course.exercises import check_real_rows


def test_real_rows_grader(capsys):
    def right(d0, world_size, rank):
        chunk = -(-d0 // world_size)
        return max(0, min(chunk, d0 - rank * chunk))

    assert check_real_rows(right)
    assert not check_real_rows(lambda d0, world_size, rank: -(-d0 // world_size))    # ignores the short tail
    assert not check_real_rows("not a function")
    assert "2 of 8 cases right" in capsys.readouterr().out
