"""A GAN trained the way pytorch/examples' dcgan/main.py trains one (BSD-3-Clause,
licenses/pytorch-examples-LICENSE): per iteration the discriminator's step on a real and a fake batch
(two backward calls), then the generator's step; two Adam optimizers, one iteration each. Small MLPs on
2-D points instead of convolutions on images, so a CPU runs it in seconds. Prints the example's line.

    python gan.py --iters 6
"""

import argparse

import torch
import torch.nn as nn
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument('--iters', type=int, default=6)
parser.add_argument('--batchSize', type=int, default=16)
opt = parser.parse_args()
torch.manual_seed(0)
nz = 4


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        self.main = nn.Sequential(nn.Linear(nz, 32), nn.ReLU(True), nn.Linear(32, 2))

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2, inplace=True), nn.Linear(32, 1), nn.Sigmoid())

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


def real_batch(n):
    angle = torch.rand(n) * 6.2832
    return torch.stack([angle.cos(), angle.sin()], 1) + 0.05 * torch.randn(n, 2)


netG = Generator()
netD = Discriminator()
criterion = nn.BCELoss()
real_label = 1.
fake_label = 0.
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))

for i in range(opt.iters):
    ############################
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    ###########################
    # train with real
    netD.zero_grad()
    real_cpu = real_batch(opt.batchSize)
    batch_size = real_cpu.size(0)
    label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)

    output = netD(real_cpu)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()

    # train with fake
    noise = torch.randn(batch_size, nz)
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()

    ############################
    # (2) Update G network: maximize log(D(G(z)))
    ###########################
    netG.zero_grad()
    label.fill_(real_label)  # fake labels are real for generator cost
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    D_G_z2 = output.mean().item()
    optimizerG.step()

    print('[%d/%d] Loss_D: %r Loss_G: %r D(x): %.4f D(G(z)): %.4f / %.4f'
          % (i, opt.iters, errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))
