"""``mdeci demo``: the whole story on one machine (broker, alice's phone, bob's feed).

:mod:`mdeci.demo.plan` says what happens when, :mod:`mdeci.demo.story` runs it,
:mod:`mdeci.demo.summary` judges the outcome (lost, duplicated, out of order) and
:mod:`mdeci.demo.view` shows it live (``rich``) or as plain lines.
"""
