"""torchvision's ResNet-18/50, MobileNetV2, MobileNetV3-small and EfficientNet-B0, rewritten with the
same module structure, state_dict keys and forward code (torchvision 0.28), for environments where
torchvision cannot be installed (its wheels' C++ ops need a matching CUDA build of PyTorch).
`build(name)` uses torchvision's own models when it imports, these replicas otherwise."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

ARCHITECTURES = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0")


def build(name: str, num_classes: int = 1000) -> nn.Module:
    """Architecture `name` with random weights: torchvision's when available, else the replica."""
    try:
        import torchvision.models as tvm

        return getattr(tvm, name)(num_classes=num_classes)
    except Exception:  # noqa: BLE001 - absent, or present but broken (C++ ops of another build)
        return REPLICAS[name](num_classes=num_classes)


def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias before a norm), norm, activation."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
        norm_layer: Callable[..., nn.Module] | None = nn.BatchNorm2d,
        activation_layer: Callable[..., nn.Module] | None = nn.ReLU,
        dilation: int = 1,
    ) -> None:
        padding = (kernel_size - 1) // 2 * dilation
        layers: list[nn.Module] = [
            nn.Conv2d(
                cin, cout, kernel_size, stride, padding, dilation=dilation, groups=groups, bias=norm_layer is None
            )
        ]
        if norm_layer is not None:
            layers.append(norm_layer(cout))
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(
        self,
        cin: int,
        squeeze: int,
        activation: Callable[..., nn.Module] = nn.ReLU,
        scale_activation: Callable[..., nn.Module] = nn.Sigmoid,
    ) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(cin, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, cin, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth, mode 'row'."""

    def __init__(self, p: float, mode: str = "row") -> None:
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        survival = 1.0 - self.p
        noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device)
        noise = noise.bernoulli_(survival)
        if survival > 0.0:
            noise.div_(survival)
        return x * noise


# -- ResNet -------------------------------------------------------------------------------------------


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block: Any, layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block: Any, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


# -- MobileNetV2 ---------------------------------------------------------------------------------------


class InvertedResidualV2(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvNormActivation(inp, hidden, 1, activation_layer=nn.ReLU6))
        layers += [
            ConvNormActivation(hidden, hidden, stride=stride, groups=hidden, activation_layer=nn.ReLU6),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    SETTING = [
        [1, 16, 1, 1],
        [6, 24, 2, 2],
        [6, 32, 3, 2],
        [6, 64, 4, 2],
        [6, 96, 3, 1],
        [6, 160, 3, 2],
        [6, 320, 1, 1],
    ]

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        cin, last = 32, 1280
        features: list[nn.Module] = [ConvNormActivation(3, cin, stride=2, activation_layer=nn.ReLU6)]
        for t, c, n, s in self.SETTING:
            for i in range(n):
                features.append(InvertedResidualV2(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(ConvNormActivation(cin, last, 1, activation_layer=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000) -> MobileNetV2:
    return MobileNetV2(num_classes)


# -- MobileNetV3-small --------------------------------------------------------------------------------


class InvertedResidualV3(nn.Module):
    def __init__(
        self,
        cin: int,
        kernel: int,
        expanded: int,
        cout: int,
        use_se: bool,
        hs: bool,
        stride: int,
        norm_layer: Callable[..., nn.Module],
    ) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormActivation(cin, expanded, 1, norm_layer=norm_layer, activation_layer=act))
        layers.append(ConvNormActivation(expanded, expanded, kernel, stride, expanded, norm_layer, act))
        if use_se:
            layers.append(
                SqueezeExcitation(expanded, _make_divisible(expanded // 4, 8), scale_activation=nn.Hardsigmoid)
            )
        layers.append(ConvNormActivation(expanded, cout, 1, norm_layer=norm_layer, activation_layer=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


class MobileNetV3Small(nn.Module):
    # input, kernel, expanded, output, SE, hardswish, stride
    SETTING = [
        (16, 3, 16, 16, True, False, 2),
        (16, 3, 72, 24, False, False, 2),
        (24, 3, 88, 24, False, False, 1),
        (24, 5, 96, 40, True, True, 2),
        (40, 5, 240, 40, True, True, 1),
        (40, 5, 240, 40, True, True, 1),
        (40, 5, 120, 48, True, True, 1),
        (48, 5, 144, 48, True, True, 1),
        (48, 5, 288, 96, True, True, 2),
        (96, 5, 576, 96, True, True, 1),
        (96, 5, 576, 96, True, True, 1),
    ]

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [ConvNormActivation(3, 16, 3, 2, norm_layer=norm, activation_layer=nn.Hardswish)]
        layers += [InvertedResidualV3(*cfg, norm_layer=norm) for cfg in self.SETTING]
        layers.append(ConvNormActivation(96, 576, 1, norm_layer=norm, activation_layer=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(576, 1024),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=dropout, inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def mobilenet_v3_small(num_classes: int = 1000) -> MobileNetV3Small:
    return MobileNetV3Small(num_classes)


# -- EfficientNet-B0 ---------------------------------------------------------------------------------------


class MBConv(nn.Module):
    def __init__(self, expand_ratio: float, kernel: int, stride: int, cin: int, cout: int, sd_prob: float) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        expanded = _make_divisible(cin * expand_ratio, 8)
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormActivation(cin, expanded, 1, activation_layer=nn.SiLU))
        layers.append(ConvNormActivation(expanded, expanded, kernel, stride, expanded, activation_layer=nn.SiLU))
        layers.append(SqueezeExcitation(expanded, max(1, cin // 4), activation=partial(nn.SiLU, inplace=True)))
        layers.append(ConvNormActivation(expanded, cout, 1, activation_layer=None))
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(sd_prob, "row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += x
        return result


class EfficientNetB0(nn.Module):
    # expand ratio, kernel, stride, input, output, layers
    SETTING = [
        (1, 3, 1, 32, 16, 1),
        (6, 3, 2, 16, 24, 2),
        (6, 5, 2, 24, 40, 2),
        (6, 3, 2, 40, 80, 3),
        (6, 5, 1, 80, 112, 3),
        (6, 5, 2, 112, 192, 4),
        (6, 3, 1, 192, 320, 1),
    ]

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2, stochastic_depth_prob: float = 0.2) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvNormActivation(3, 32, 3, 2, activation_layer=nn.SiLU)]
        total = sum(cfg[-1] for cfg in self.SETTING)
        block_id = 0
        for expand, kernel, stride, cin, cout, n in self.SETTING:
            stage = []
            for i in range(n):
                sd = stochastic_depth_prob * float(block_id) / total
                stage.append(MBConv(expand, kernel, stride if i == 0 else 1, cin if i == 0 else cout, cout, sd))
                block_id += 1
            layers.append(nn.Sequential(*stage))
        layers.append(ConvNormActivation(320, 1280, 1, activation_layer=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout, inplace=True), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def efficientnet_b0(num_classes: int = 1000) -> EfficientNetB0:
    return EfficientNetB0(num_classes)


REPLICAS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3_small": mobilenet_v3_small,
    "efficientnet_b0": efficientnet_b0,
}
