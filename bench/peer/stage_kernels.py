"""One rank's compute of peer_bench's 1F1B step, without any pipeline runtime: 4 x (Linear(1024,
1024), ReLU), 8 microbatches of 32 rows, each forward then backward, one thread. It prints the
median of 20 timed repetitions (after 5 untimed), so that two PyTorch stacks' kernels can be
compared on the same machine, e.g. Debian 12's and the trixie chroot's:

    /usr/bin/python3 bench/peer/stage_kernels.py
    sudo chroot /var/tmp/stagecoach-trixie python3 /stagecoach/bench/peer/stage_kernels.py
"""
import statistics
import time

import torch


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    stage = torch.nn.Sequential(*layers)
    inputs = [torch.randn(32, 1024, requires_grad=True) for _ in range(8)]
    output_grads = [torch.randn(32, 1024) for _ in range(8)]
    times = []
    for _ in range(25):
        for p in stage.parameters():
            p.grad = None
        start = time.perf_counter()
        for x, g in zip(inputs, output_grads):
            stage(x).backward(g)
        times.append(time.perf_counter() - start)
    print(f"torch {torch.__version__}: forward and backward of 8 microbatches, "
          f"median {1e3 * statistics.median(times[5:]):.1f} ms")


if __name__ == "__main__":
    main()
