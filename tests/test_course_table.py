"""08's closing "course in one table": each row's formulas are what `model_states` and
`comm_volume` compute for that strategy (mixed-precision Adam, M = 2Ψ), at several N."""
from fractions import Fraction

from course_utils.comm import comm_volume
from course_utils.memory import model_states
from notebook_text import cell_source

PSI = 129_350                                       # the course GPT; numel not divisible by N
ROWS = {                                            # row start -> (stage, states / Ψ, sends / M), of N
    "| DDP (02) | 16Ψ | all-reduce of the gradients: 2(N-1)/N·M": (0, lambda n: 16, lambda n: Fraction(2 * (n - 1), n)),
    "| ZeRO-1 (04) | (4 + 12/N)Ψ | reduce-scatter + all-gather: 2(N-1)/N·M": (1, lambda n: 4 + Fraction(12, n),
                                                                              lambda n: Fraction(2 * (n - 1), n)),
    "| ZeRO-2 (05) | (2 + 14/N)Ψ | the same": (2, lambda n: 2 + Fraction(14, n), lambda n: Fraction(2 * (n - 1), n)),
    "| ZeRO-3, FSDP2 (06, 07) | 16Ψ/N | 2 all-gathers + 1 reduce-scatter: 3(N-1)/N·M": (
        3, lambda n: Fraction(16, n), lambda n: Fraction(3 * (n - 1), n)),
}


def test_the_course_in_one_table_is_what_the_models_compute():
    text = cell_source("08_beyond_one_box.ipynb", "**The course in one table**")
    m = 2 * PSI
    for row, (stage, states, sends) in ROWS.items():
        assert row in text, row
        for n in (2, 3, 4, 8):
            assert abs(model_states(PSI, world_size=n, stage=stage).total - float(states(n) * PSI)) < 1e-6 * PSI, (row, n)
            assert abs(comm_volume(PSI, world_size=n, stage=stage)["total"] - float(sends(n) * m)) < 1e-6 * m, (row, n)
    # HSDP on n nodes of g: ZeRO-3's states over the g ranks of a node
    assert "| HSDP, N = n nodes × g (08) | 16Ψ/g |" in text
    assert model_states(PSI, world_size=8, stage=3).total == 2 * PSI
