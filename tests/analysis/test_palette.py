"""The models' colours stay apart: any two of the first 13 differ by CIEDE2000 ≥ 15 (the review
found the general-luong orange and the Transformer's red-orange hard to tell apart)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest


def srgb_to_lab(rgb) -> np.ndarray:
    """CIE L*a*b* (D65) of an sRGB colour with components in [0, 1] (IEC 61966-2-1, CIE 1976)."""
    rgb = np.asarray(rgb, float)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    to_xyz = np.array(
        [
            [0.4124564, 0.3575761, 0.1804375],
            [0.2126729, 0.7151522, 0.0721750],
            [0.0193339, 0.1191920, 0.9503041],
        ]
    )
    t = (to_xyz @ linear) / np.array([0.95047, 1.0, 1.08883])
    d = 6 / 29
    f = np.where(t > d**3, np.cbrt(t), t / (3 * d * d) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def ciede2000(lab1, lab2) -> float:
    """The CIEDE2000 colour difference (Sharma, Wu & Dalal 2005, eqs. 1–22; k_L = k_C = k_H = 1)."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean**7 / (c_mean**7 + 25**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    if c1p * c2p == 0:
        dh = 0.0
    elif abs(h2p - h1p) <= 180:
        dh = h2p - h1p
    else:
        dh = h2p - h1p - 360 if h2p > h1p else h2p - h1p + 360
    d_l, d_c = l2 - l1, c2p - c1p
    d_h = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    l_mean, cp_mean = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_mean = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_mean = (h1p + h2p) / 2
    else:
        h_mean = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (
        1
        - 0.17 * math.cos(math.radians(h_mean - 30))
        + 0.24 * math.cos(math.radians(2 * h_mean))
        + 0.32 * math.cos(math.radians(3 * h_mean + 6))
        - 0.20 * math.cos(math.radians(4 * h_mean - 63))
    )
    d_theta = 30 * math.exp(-(((h_mean - 275) / 25) ** 2))
    r_c = 2 * math.sqrt(cp_mean**7 / (cp_mean**7 + 25**7))
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * cp_mean, 1 + 0.015 * cp_mean * t
    r_t = -math.sin(math.radians(2 * d_theta)) * r_c
    return math.sqrt(
        (d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (d_c / s_c) * (d_h / s_h)
    )


@pytest.mark.parametrize(
    ("lab1", "lab2", "expected"),
    [  # Sharma, Wu & Dalal (2005), table 1: pairs 1, 2, 3, 7, 17, 20 and 24
        ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
        ((50.0, 3.1571, -77.2803), (50.0, 0.0, -82.7485), 2.8615),
        ((50.0, 2.8361, -74.0200), (50.0, 0.0, -82.7485), 3.4412),
        ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
        ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
        ((50.0, 2.5, 0.0), (50.0, 3.1736, 0.5854), 1.0000),
        ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
    ],
)
def test_ciede2000_reproduces_the_published_test_data(lab1, lab2, expected):
    assert ciede2000(lab1, lab2) == pytest.approx(expected, abs=1e-4)


def test_srgb_to_lab_known_values():
    assert srgb_to_lab((1, 1, 1)) == pytest.approx([100, 0, 0], abs=1e-3)
    assert srgb_to_lab((1, 0, 0)) == pytest.approx([53.24, 80.09, 67.20], abs=0.02)


def test_any_two_of_thirteen_models_differ_by_at_least_15():
    from attnstudy.analysis.figures import variant_palette

    palette = variant_palette([f"m{i}" for i in range(13)])
    labs = [srgb_to_lab(c) for c in palette.values()]
    worst = min(ciede2000(a, b) for a, b in itertools.combinations(labs, 2))
    assert worst >= 15, worst


def test_layers_in_legends_are_counted_from_1_as_in_the_report():
    """The figures named a Transformer's layers 0, 1 (the stored index) where the report's
    tables and the example browser say layer 1, 2."""
    import pandas as pd
    from attnstudy.analysis.figures.base import per_layer

    df = pd.DataFrame(
        {"variant": ["t", "t", "t", "a"], "layer": [0, 1, 1, 0], "value": [1.0, 2.0, 3.0, 4.0]}
    )
    out, palette = per_layer(df)
    assert out["variant"].tolist() == ["t · layer 1", "t · layer 2", "t · layer 2", "a"]
    assert {"t · layer 1", "t · layer 2", "a"} <= set(palette)
