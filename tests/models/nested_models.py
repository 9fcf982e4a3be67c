"""Models as users write them, for the tests of nested layers, buffers and shape probes
(worker/model/torchscript_model.h "Nested layers"; tests/e2e/model_state_test.cc). All take
images of 3 x 8 x 8 and give 5 class logits; built from torch.nn blocks, scriptable.

  ResNet       a stem (nn.Sequential with BatchNorm), two residual BatchNorm blocks layer1 and
               layer2, a head (nn.Sequential); layers stem, layer1, layer2, head.
  ViT          ViT-style: conv_proj (patches), a class token, an `encoder` holding a position
               embedding, an nn.Sequential `layers` of four encoder blocks named
               encoder_layer_0 .. encoder_layer_3 (as torchvision names them) and a LayerNorm
               `ln`, then `heads`. The encoder holds most of the parameters around a stack of
               blocks, so its calls are opened: the layers are conv_proj,
               encoder.layers.encoder_layer_0 .. 3, encoder.ln, heads.
  AttrRead     stem, block1, then `h + self.extras.pos_embedding` (a parameter of a module the
               forward never calls), block2 (BatchNorm blocks), head; a 5th-free buffer
               `extras.scale` that nothing reads.

make(name) builds the seeded eager module; main(OUT_DIR) writes each one scripted as NAME.pt.
"""

import collections
import math
import os
import sys

import torch
import torch.nn as nn


class BnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(h)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = BnBlock(8)
        self.layer2 = BnBlock(8)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        return self.head(self.layer2(self.layer1(self.stem(x))))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.size(0), x.size(1), x.size(2)
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, t, d))


class EncoderBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.self_attention = Attention(d, 2)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.self_attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    def __init__(self, d: int, tokens: int, blocks: int):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, tokens, d) * 0.02)
        self.layers = nn.Sequential(collections.OrderedDict(
            ("encoder_layer_%d" % i, EncoderBlock(d)) for i in range(blocks)))
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(self.layers(x + self.pos_embedding))


class ViT(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, kernel_size=4, stride=4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d))
        self.encoder = Encoder(d, 5, 4)
        self.heads = nn.Linear(d, 5)

    def forward(self, x):
        n = x.size(0)
        h = self.conv_proj(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.class_token.expand(n, -1, -1), h], dim=1)
        h = self.encoder(h)
        return self.heads(h[:, 0])


class Extras(nn.Module):
    """Tensors the top-level forward reads by attribute; never called."""

    def __init__(self):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, 8, 8, 8) * 0.1)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        return x + self.pos_embedding


class AttrRead(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.extras = Extras()
        self.block1 = BnBlock(8)
        self.block2 = BnBlock(8)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        h = self.block1(torch.relu(self.stem(x)))
        h = h + self.extras.pos_embedding
        return self.head(self.block2(h))


BUILDERS = {"resnet": ResNet, "vit": ViT, "attrread": AttrRead}


def make(name: str) -> nn.Module:
    torch.manual_seed(3)
    return BUILDERS[name]()


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for name in BUILDERS:
        torch.jit.save(torch.jit.script(make(name)), os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: nested_models.py OUT_DIR")
    main(sys.argv[1])
