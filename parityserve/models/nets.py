"""Reference architectures (PyTorch) whose state_dict keys match the published weights.

Importing this module imports torch; ``parityserve.models.zoo`` only does so on demand.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from parityserve.config import TensorSpec

__all__ = [
    "BasicBlock",
    "CifarResNet",
    "DigitsMLP",
    "LeNet5",
    "ParMMLP",
    "RESNET_DEPTHS",
    "cifar_resnet",
]

RESNET_DEPTHS = (20, 32, 44, 56)


class ParMMLP(nn.Module):
    """The ParM paper's MNIST / Fashion-MNIST base MLP: 784-200-100-10 with ReLU."""

    input_spec: ClassVar[TensorSpec] = TensorSpec(name="input", datatype="FP32", shape=(784,))
    output_spec: ClassVar[TensorSpec] = TensorSpec(name="logits", datatype="FP32", shape=(10,))

    def __init__(self) -> None:
        super().__init__()
        # The attribute name `nn` is what gives the published keys their `nn.0.` prefix.
        self.nn = nn.Sequential(
            nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 100), nn.ReLU(), nn.Linear(100, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.nn(x.reshape(x.shape[0], 784))
        return out


class DigitsMLP(nn.Module):
    """A small MLP for scikit-learn's 8x8 digits (pixels / 16): 64-64-10 with ReLU.

    It has no published weights: ``parityserve train-parity --dataset digits`` trains one
    (and its parity model) in seconds.
    """

    input_spec: ClassVar[TensorSpec] = TensorSpec(name="input", datatype="FP32", shape=(64,))
    output_spec: ClassVar[TensorSpec] = TensorSpec(name="logits", datatype="FP32", shape=(10,))

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.nn = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.nn(x.reshape(x.shape[0], 64))
        return out


class LeNet5(nn.Module):
    """LeNet-5 for 1x28x28 images (ReLU, max pooling); also takes flattened 784-pixel rows."""

    input_spec: ClassVar[TensorSpec] = TensorSpec(name="input", datatype="FP32", shape=(1, 28, 28))
    output_spec: ClassVar[TensorSpec] = TensorSpec(name="logits", datatype="FP32", shape=(10,))

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        out: torch.Tensor = self.fc3(F.relu(self.fc2(x)))
        return out


class _PadShortcut(nn.Module):
    """Option A shortcut: subsample by 2 and zero-pad the new channels (no parameters)."""

    def __init__(self, extra_channels: int) -> None:
        super().__init__()
        self.extra = extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = self.extra // 2
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, half, self.extra - half))


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a parameter-free shortcut (He et al. 2016, option A)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        reshape = stride != 1 or in_planes != planes
        self.shortcut: nn.Module = _PadShortcut(planes - in_planes) if reshape else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR-10 ResNet of depth 6n+2 with 16-32-64 channels."""

    input_spec: ClassVar[TensorSpec] = TensorSpec(name="input", datatype="FP32", shape=(3, 32, 32))
    output_spec: ClassVar[TensorSpec] = TensorSpec(name="logits", datatype="FP32", shape=(10,))

    def __init__(self, depth: int = 20, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 (e.g. 20, 32, 44, 56), got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = _stage(16, 16, n, stride=1)
        self.layer2 = _stage(16, 32, n, stride=2)
        self.layer3 = _stage(32, 64, n, stride=2)
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        logits: torch.Tensor = self.linear(out.mean(dim=(2, 3)))
        return logits


def _stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    layers = [BasicBlock(in_planes, planes, stride)]
    layers += [BasicBlock(planes, planes, 1) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def cifar_resnet(depth: int) -> CifarResNet:
    return CifarResNet(depth)
