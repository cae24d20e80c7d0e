"""The thesis' utility function: ``f = wc ln C + we ln E + wl ln L + wv ln(1/V)``.

Lower is better. A quantity of zero (a free Wi-Fi channel has ``C = 0``) would make
``ln`` minus infinity, so every quantity is clamped to :data:`FLOOR` first; a term whose
weight is zero is left out, so ``0 * ln 0`` never turns into NaN.
"""

from __future__ import annotations

import math

from mdeci.channels.model import Channel, Weights

#: Smallest value a quantity is given before its logarithm (1e-12 $ is far below any price).
FLOOR = 1e-12


def _ln(value: float) -> float:
    return math.log(max(value, FLOOR))


def score(channel: Channel, weights: Weights, size: int) -> float:
    """Utility of sending a ``size``-byte message on ``channel``; the lowest score wins."""
    total = 0.0
    if weights.cost:
        total += weights.cost * _ln(channel.cost(size))
    if weights.energy:
        total += weights.energy * _ln(channel.energy_mw)
    if weights.latency:
        total += weights.latency * _ln(channel.latency_ms)
    if weights.coverage:
        total += weights.coverage * -_ln(channel.coverage)
    return total


def fixed_terms(channel: Channel, weights: Weights) -> tuple[float, ...]:
    """The size-independent terms of :func:`score` (energy, latency, coverage), in its
    order, with zero-weight terms left out: precomputed once per channel and class."""
    terms: list[float] = []
    if weights.energy:
        terms.append(weights.energy * _ln(channel.energy_mw))
    if weights.latency:
        terms.append(weights.latency * _ln(channel.latency_ms))
    if weights.coverage:
        terms.append(weights.coverage * -_ln(channel.coverage))
    return tuple(terms)


def score_with(fixed: tuple[float, ...], cost_weight: float, cost: float) -> float:
    """:func:`score` from :func:`fixed_terms` and the message's cost (same sum order, so
    the same float)."""
    total = 0.0
    if cost_weight:
        total += cost_weight * _ln(cost)
    for term in fixed:
        total += term
    return total
