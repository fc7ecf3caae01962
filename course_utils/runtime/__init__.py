"""Running a function on N ranks (``launch``, ``%%ranks``), where that happens (``env``),
what the ranks send (``ledger``), torch version differences (``compat``) and printing
numbers portably (``fmt``)."""
