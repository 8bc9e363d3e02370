"""The batched form's row of one running request (batched.py, small.py): the columns of its integer state, and of its
float state."""

# vLLM's and the verify's state: request id, prompt and trace lengths, tokens emitted, tokens computed, drafts held,
# the K they were drafted under, KV blocks, whether the first token is out, the cap, where the trace's tables start,
# the answers a fresh target has (`TraceTable.known_total`), verifies so far, drafted and accepted tokens, the
# proposal length before K, the target's position at the last verify, steps verified past the trace, whether the
# reply ended on such a step, and whether it stopped at an EOS.
(RID, PLEN, TLEN, EMIT, COMP, SPEC, K, BLOCKS, STARTED, CAP, TOFF, KNOWN0, NVER) = range(13)
(DRAFTED, ACCEPTED, AVAIL, POS, UNK, UTAIL, EOS) = range(13, 20)
COLUMNS = 20
BUSY, FIRST = 0, 1  # time in steps (added step by step, as the reference adds it), and the first token's time
