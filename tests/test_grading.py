"""The grading engine's reports stay short: an unfinished exercise prints a few lines
(issue 17: committed outputs of unfinished exercises are at most 5 lines)."""
from course_utils.labs.grading import SHOWN_WRONG_CASES, grade_cases, report_problems


def test_grade_cases_shows_few_wrong_cases_and_counts_the_rest(capsys):
    cases = [{"x": x} for x in range(7)]
    verdict = grade_cases(lambda x: 0 if x < 2 else (1 / 0 if x == 6 else -x), cases, lambda x: 2 * x,
                          name="double")
    lines = capsys.readouterr().out.splitlines()
    assert not verdict and len(lines) <= 4                  # + the Verdict's own line = 5
    assert lines[0] == "  double(x=1): differs: got 0, expected 2"
    assert lines[SHOWN_WRONG_CASES] == "  ... and 4 more case(s) differ"
    assert lines[-1] == "1 of 7 cases right"


def test_grade_cases_lists_every_case_when_all_are_right(capsys):
    assert grade_cases(lambda x: 2 * x, [{"x": 1}, {"x": 2}, {"x": 3}], lambda x: 2 * x, name="double")
    assert capsys.readouterr().out.splitlines() == [
        "  double(x=1): right (2)", "  double(x=2): right (4)", "  double(x=3): right (6)",
        "3 of 3 cases right"]


def test_report_problems_is_one_line(capsys):
    assert not report_problems("2 gloo ranks on CPU", ["a is wrong", "b is wrong"], "fine")
    assert report_problems("3 gloo ranks on CPU", [], "fine")
    assert capsys.readouterr().out.splitlines() == [
        "2 gloo ranks on CPU: not yet: a is wrong; b is wrong", "3 gloo ranks on CPU: right: fine"]
