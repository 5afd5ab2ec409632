"""What every chapter's puzzles and figures stand on; nothing here imports a chapter.

``base`` (the Puzzle record, host calls, what an answer may not reach), ``kernel_harness`` (the
article's kernel with a replaced part, against the oracles), ``engine_harness`` (a tiny engine
with a replaced piece, against a stock one), ``shapes`` (every constant an answer may name,
drawn afresh), ``kept_state`` (an answer that keeps state between calls or reaches around its
arguments is refused), ``faults`` (an exception in the checker's own code is the checker's
fault), ``mistakes`` (the classic wrong answers the chapters demonstrate), ``addresses`` (read
maps: which threads read which memory) and ``widgets`` (the step slider).
"""
