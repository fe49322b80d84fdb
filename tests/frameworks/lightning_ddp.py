"""Run under torchrun (2 processes, gloo on the CPU, or one GPU per rank): the same LightningModule
fed by torch's DataLoader and by gputransforms.DataLoader, only the class swapped. Each rank writes,
per case, the (file index, label) pairs it saw, read from the pixels (tests/conftest.decode_index).

    torchrun --nproc_per_node=2 tests/frameworks/lightning_ddp.py DATA OUT [--accelerator gpu]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.utils.data as tud

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lightning as L  # noqa: E402

from conftest import decode_index  # noqa: E402
from gputransforms import DataLoader, datasets  # noqa: E402
from gputransforms import transforms as T  # noqa: E402


class Recorder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict = {}
        self.devices: set = set()

    def record(self, stage, batch):
        x, y = batch
        self.devices.add(str(x.device))
        self.seen.setdefault(f"{stage}/{self.current_epoch}", []).extend(zip(decode_index(x)[0], y.tolist()))
        return self.layer(torch.ones(1, 1, device=self.device)).sum()

    def training_step(self, batch, i):
        return self.record("fit", batch)

    def validation_step(self, batch, i):
        self.record("validate", batch)

    def test_step(self, batch, i):
        self.record("test", batch)

    def predict_step(self, batch, i):
        self.record("predict", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--timing-data", default="", help="also time training epochs on this ImageFolder (GPU figures)")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--timing-only", action="store_true")
    a = ap.parse_args()
    tf = T.Compose([T.Resize((8, 8)), T.PILToTensor()])
    ds = datasets.ImageFolder(a.data, transform=tf)
    results = {}

    def trainer(**kw):
        L.seed_everything(0, verbose=False)  # each case starts from the same random state for both loaders
        base = dict(accelerator=a.accelerator, devices=a.devices, strategy="ddp", logger=False, enable_checkpointing=False,
                    default_root_dir=a.out,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        base.update(kw)
        return L.Trainer(**base)

    for kind, cls in () if a.timing_only else (("torch", tud.DataLoader), ("ours", DataLoader)):
        def loader(**kw):
            return cls(ds, batch_size=4, **kw)

        results[f"{kind}/backend"] = getattr(loader(), "backend", "torch")
        for shuffle, drop_last in ((True, False), (False, False), (True, True)):
            m = Recorder()
            trainer(max_epochs=2).fit(m, train_dataloaders=loader(shuffle=shuffle, drop_last=drop_last))
            results[f"{kind}/fit-shuffle{int(shuffle)}-drop{int(drop_last)}"] = m.seen
            results[f"{kind}/devices"] = sorted(m.devices)
        m = Recorder()
        trainer(max_epochs=1, use_distributed_sampler=False).fit(m, train_dataloaders=loader(shuffle=True))
        results[f"{kind}/fit-no-injection"] = m.seen
        m = Recorder()
        trainer(max_epochs=1, limit_train_batches=2).fit(m, train_dataloaders=loader(shuffle=True))
        results[f"{kind}/fit-limit2"] = m.seen
        m = Recorder()
        trainer(max_epochs=1, overfit_batches=2).fit(m, train_dataloaders=loader(shuffle=True))
        results[f"{kind}/fit-overfit2"] = m.seen
        m = Recorder()
        t = trainer()
        t.validate(m, dataloaders=loader())
        t.test(m, dataloaders=loader())
        t.predict(m, dataloaders=loader())
        results[f"{kind}/eval"] = m.seen
        # mid-epoch resume through Lightning's own checkpoint, as after a preemption: a checkpoint
        # written after the second step of epoch 0, then a new Trainer resumes from it
        ckpt = os.path.join(a.out, f"{kind}-mid.ckpt")

        class SaveAfterTwoSteps(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if trainer.global_step == 2:
                    module.head = {k: list(v) for k, v in module.seen.items()}
                    trainer.save_checkpoint(ckpt)

        m = Recorder()
        trainer(max_epochs=1, callbacks=[SaveAfterTwoSteps()]).fit(m, train_dataloaders=loader(shuffle=True))
        head = m.head
        m = Recorder()
        trainer(max_epochs=2).fit(m, train_dataloaders=loader(shuffle=True), ckpt_path=ckpt)
        results[f"{kind}/resume-head"] = head
        results[f"{kind}/resume-rest"] = m.seen

        # Lightning Fabric: setup_dataloaders injects the DistributedSampler the same way
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator=a.accelerator, devices=2, strategy="ddp")
        fabric.launch()
        L.seed_everything(0, verbose=False)
        dl = fabric.setup_dataloaders(loader(shuffle=True))
        seen = {}
        for e in range(2):
            dl.sampler.set_epoch(e) if hasattr(dl.sampler, "set_epoch") else None
            seen[f"fabric/{e}"] = [(i, y) for x, lab in dl for i, y in zip(decode_index(x)[0], lab.tolist())]
        results[f"{kind}/fabric"] = seen
        results[f"{kind}/fabric-class"] = type(getattr(dl, "_dataloader", dl)).__module__

    if a.timing_data:  # images/s per rank through Lightning: epochs 2-3 (after the pipeline's start)
        big = datasets.ImageFolder(a.timing_data, transform=T.Compose([
            T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))

        class Timed(Recorder):
            def on_train_epoch_start(self):
                self.marks = getattr(self, "marks", []) + [(getattr(self, "n", 0), time.perf_counter())]

            def on_train_epoch_end(self):
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                self.end = (self.n, time.perf_counter())

            def training_step(self, batch, i):
                self.n = getattr(self, "n", 0) + len(batch[0])
                self.devices.add(str(batch[0].device))
                return self.layer(torch.ones(1, 1, device=self.device)).sum()

        m = Timed()
        timed_loader = DataLoader(big, batch_size=256, shuffle=True, num_workers=8)
        trainer(max_epochs=6).fit(m, train_dataloaders=timed_loader)
        (n1, t1), end = m.marks[1], m.end  # epochs 2 to 6, inside fit (not its setup or teardown)
        results["timing"] = dict(images=end[0] - n1, seconds=end[1] - t1, img_s=(end[0] - n1) / (end[1] - t1),
                                 devices=sorted(m.devices), epoch_images=m.n // 6, backend=timed_loader.backend)

    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(a.out, f"lightning-rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
