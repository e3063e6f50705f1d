"""Alerts raised while a run trains: ``watch`` follows a run (from the training process's rank 0
or from ``gpudash serve``) and applies the rules of :mod:`gpudash.analysis.alerts`; ``delivery``
sends what they raise (webhook, desktop, terminal) from a thread of its own.

Neither torch nor dash is imported here: both the training side and the server run alerts.
"""
