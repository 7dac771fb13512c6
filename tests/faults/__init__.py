"""The faults suite (issue 12): each test against the real broker and real processes, each
with bounded loops, each asserting "nothing lost, nothing duplicated, every turn terminal".
Marker ``faults``; run by ``make test``."""
