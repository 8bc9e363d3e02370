"""Training the distilled governor (policies/distilled.py) from hindsight: samples along the oracle's schedule, two
logistic models fitted to them, the decision settings chosen on the training rows, and the held-out evaluation."""
