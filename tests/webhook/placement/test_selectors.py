"""Selector annotations: each error names the key the user wrote."""

from __future__ import annotations

import pytest

from kube_vgpu.webhook.placement.selectors import SelectorError, parse_selectors


def test_selector_errors_name_the_key_the_user_wrote() -> None:
    with pytest.raises(SelectorError, match=r"nvidia\.com/use-gpuuuid"):
        parse_selectors({"nvidia.com/use-gpuuuid": "GPU-a,"})
    with pytest.raises(SelectorError, match="not a GPU UUID"):
        parse_selectors({"volcano.sh/vgpu-use-gpuuuid": "GPU a"})
    with pytest.raises(SelectorError, match="empty item"):
        parse_selectors({"nvidia.com/nouse-gputype": ""})
    # After a first admission, the user's own words are read back from the kube-vgpu.io copy.
    again = parse_selectors({"nvidia.com/use-gputype": "[NVIDIA A10]", "kube-vgpu.io/use-gputype": "A10"})
    assert again.use_types == ("A10",) and again.nouse_types is None
