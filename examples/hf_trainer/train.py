"""A Hugging Face Trainer script as its users write it (no harness import).

    python train.py --output-dir runs/hf --max-steps 24 --save-steps 5

A tiny GPT-2 built from a config (no download), trained on synthetic token sequences on the CPU;
the Trainer saves a checkpoint every ``--save-steps`` steps and the script resumes from the newest
one in the output directory (``get_last_checkpoint`` + ``resume_from_checkpoint``).
"""
from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", default="hf_runs")
    p.add_argument("--max-steps", type=int, default=24)
    p.add_argument("--save-steps", type=int, default=5)
    args = p.parse_args()

    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps,
                                 per_device_train_batch_size=4, learning_rate=1e-3, warmup_steps=3,
                                 logging_steps=1, report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0,
                                 disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(96, 32, config.vocab_size))
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))


if __name__ == "__main__":
    main()
