"""The MIG geometry this project ships: the `device-config.yaml` the chart's ConfigMap and the local
demo carry, with entries for A100-40GB, A100-80GB, H100-80GB and H200, in the format of
Volcano's pkg/scheduler/api/devices/config/config.go."""

from __future__ import annotations

import dataclasses
import functools

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.mig.geometry import DeviceConfig, parse_device_config

# Memory is each profile's NVML memorySizeMB, the same table the NVML simulator serves
# (standins.nvml.profiles, where the sources are cited), so a request that fits a slot here fits
# the instance the plugin creates. Groups follow Volcano's shipped layout. Models
# are substrings of the NVML name: "NVIDIA H200" does not match "NVIDIA GH200 ...", whose
# profiles differ. A whole-card request does not fit the 7g slot, whose memory is below the
# card's (once a group is in use on a GPU, Volcano offers only instance types already used there).
DEFAULT_DEVICE_CONFIG_YAML = """\
nvidia:
  resourceCountName: volcano.sh/vgpu-number
  resourceMemoryName: volcano.sh/vgpu-memory
  resourceMemoryPercentageName: volcano.sh/vgpu-memory-percentage
  resourceCoreName: volcano.sh/vgpu-cores
  gpuMemoryFactor: 1
  deviceSplitCount: 10
  deviceCoreScaling: 1
  deviceMemoryScaling: 1
  knownMigGeometries:
  - models: ["A100-SXM4-40GB", "A100-PCIE-40GB", "A100-40GB-PCIe"]
    allowedGeometries:
    - group: group1
      geometries:
      - {name: 1g.5gb, memory: 4864, count: 7}
    - group: group2
      geometries:
      - {name: 2g.10gb, memory: 9856, count: 3}
      - {name: 1g.5gb, memory: 4864, count: 1}
    - group: group3
      geometries:
      - {name: 3g.20gb, memory: 19968, count: 2}
    - group: group4
      geometries:
      - {name: 7g.40gb, memory: 40192, count: 1}
  - models: ["A100-SXM4-80GB", "A100 80GB PCIe", "A100-PCIE-80GB"]
    allowedGeometries:
    - group: group1
      geometries:
      - {name: 1g.10gb, memory: 9728, count: 7}
    - group: group2
      geometries:
      - {name: 2g.20gb, memory: 19968, count: 3}
      - {name: 1g.10gb, memory: 9728, count: 1}
    - group: group3
      geometries:
      - {name: 3g.40gb, memory: 40192, count: 2}
    - group: group4
      geometries:
      - {name: 7g.80gb, memory: 80896, count: 1}
  - models: ["H100 80GB HBM3", "H100 PCIe"]
    allowedGeometries:
    - group: group1
      geometries:
      - {name: 1g.10gb, memory: 9984, count: 7}
    - group: group2
      geometries:
      - {name: 2g.20gb, memory: 20096, count: 3}
      - {name: 1g.10gb, memory: 9984, count: 1}
    - group: group3
      geometries:
      - {name: 3g.40gb, memory: 40448, count: 2}
    - group: group4
      geometries:
      - {name: 7g.80gb, memory: 81152, count: 1}
  - models: ["NVIDIA H200"]
    allowedGeometries:
    - group: group1
      geometries:
      - {name: 1g.18gb, memory: 16384, count: 7}
    - group: group2
      geometries:
      - {name: 2g.35gb, memory: 33280, count: 3}
      - {name: 1g.18gb, memory: 16384, count: 1}
    - group: group3
      geometries:
      - {name: 3g.71gb, memory: 66560, count: 2}
    - group: group4
      geometries:
      - {name: 7g.141gb, memory: 143360, count: 1}
"""


@functools.cache
def default_device_config() -> DeviceConfig:
    """`DEFAULT_DEVICE_CONFIG_YAML`, parsed once."""
    return parse_device_config(DEFAULT_DEVICE_CONFIG_YAML)


def device_config_for(names: ResourceNames) -> DeviceConfig:
    """The shipped device config naming the resources of kube-vgpu's own config (`resourceNames:`).

    Volcano reads pod requests under the names in this document
    (pkg/scheduler/plugins/deviceshare/deviceshare.go), so it must name the same resources the webhook and the
    node plugin do.
    """
    return dataclasses.replace(
        default_device_config(),
        resource_count_name=names.count,
        resource_memory_name=names.memory,
        resource_memory_percentage_name=names.memory_percentage,
        resource_core_name=names.cores,
    )
