"""The check of every report of a verified task at the close (docs/verification.md), in the order a
report meets it:
- `randomness`: the challenges both servers derive and the client's correlated randomness;
- `maths`: `Check`, the check's two rounds and its verdicts per payload kind (pure field arithmetic),
  over the numba kernel of `sketch`; `reference` is the textbook construction the tests hold it to;
- `round_one`: round one computed while the reports arrive, stored in batches;
- `exchange`: each server's part of the messages (CheckLeader, CheckHelper) through the channel;
- `outcome`: the messages' framing and the end of the check (failures excluded, the histogram saved)."""
