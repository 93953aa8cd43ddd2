"""The check of every report of a verified task at the close (docs/verification.md), its protocol
steps in the order a report meets them, over the check's arithmetic (`dpcdf.service.verification`:
the challenges, `Check`, the kernels):
- `round_one`: round one computed while the reports arrive, stored in batches;
- `exchange`: each server's part of the messages (CheckLeader, CheckHelper) through the channel;
- `outcome`: the messages' framing and the end of the check (failures excluded, the histogram saved)."""
