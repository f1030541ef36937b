"""A trio training loop that overlaps host tracing with device execution.

    python examples/async_training.py [--steps 60] [--hidden 1024]

* a producer task prepares batches and puts them on the device ahead of use;
* the training task traces a step and schedules it with `await ltc.mark_step_async()`, which
  returns while the device runs it, so the next step is traced meanwhile;
* a logger task receives loss tensors from earlier steps and reads them with
  `await ltc.to_cpu_async(...)`, which sleeps without blocking the event loop.

At the end it reports how much device time was hidden behind tracing.
"""
from __future__ import annotations

import argparse
import time

import torch
import trio
from tqdm import tqdm

import ltc_async as ltc


async def producer(send: trio.MemorySendChannel, steps: int, batch: int, dim: int, device: str) -> None:
    async with send:
        for step in range(steps):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(batch, dim, generator=g)
            y = (x[:, :10].sum(dim=1) > 0).long()    # a learnable target
            await send.send((x.to(device), y.to(device)))
            await trio.sleep(0)


async def logger(recv: trio.MemoryReceiveChannel, every: int, steps: int) -> list[float]:
    history = []
    with tqdm(total=steps, unit="step", desc="steps run") as bar:
        async with recv:
            async for step, loss in recv:
                (value,) = await ltc.to_cpu_async([loss])   # waits for that step only
                history.append(value.item())
                bar.update(1)
                if step % every == 0:
                    bar.set_postfix(loss=f"{value.item():.4f}")
    return history


async def train(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    dim, hidden = 256, args.hidden
    model = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 2)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches_send, batches_recv = trio.open_memory_channel(4)
    losses_send, losses_recv = trio.open_memory_channel(64)
    history: list[float] = []
    trace_time = 0.0

    async def run_logger() -> None:
        history.extend(await logger(losses_recv, args.log_every, args.steps))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer, batches_send, args.steps, args.batch, dim, args.device)
        nursery.start_soon(run_logger)
        async with losses_send, batches_recv:
            step = 0
            async for x, y in batches_recv:
                t = time.perf_counter()
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                trace_time += time.perf_counter() - t
                await ltc.mark_step_async(args.device)     # scheduled; the device runs it now
                await losses_send.send((step, loss))
                step += 1
        await ltc.wait_device_ops_async()
    wall = time.perf_counter() - t0
    count, execute, _ = ltc.metrics.metric_data("ExecuteTime")
    hidden_s = max(0.0, trace_time + execute - wall)
    print(f"\n{args.steps} steps in {wall:.2f}s: host tracing {trace_time:.2f}s, device execution "
          f"{execute:.2f}s ({count} graphs)")
    print(f"device time hidden behind tracing: {hidden_s:.2f}s "
          f"({100 * hidden_s / max(1e-9, min(trace_time, execute)):.0f}% of the smaller of the two)")
    print(f"loss: first {history[0]:.4f} -> last {history[-1]:.4f}")
    if not history[-1] < history[0]:
        raise SystemExit("the loss did not decrease")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--device", default="ltc:0")
    ap.add_argument("--log-every", type=int, default=10)
    trio.run(train, ap.parse_args())


if __name__ == "__main__":
    main()
