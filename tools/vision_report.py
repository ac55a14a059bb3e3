#!/usr/bin/python3
"""Summarises a vision demo run (scripts/vision_demo.sh) as Markdown: per task accuracy with the
image, with zeros in its place and with another example's image; scenes per question type
against chance; the Fashion-MNIST confusion matrix; held-out text bits per byte of the joint run
against the text-only run; the encoder's throughput (images/s of forward + backward, from the
encoder_thread_seconds / encoder_images of metrics.jsonl) and the share of a training step the
image-text sequences and the encoder take.

  vision_report.py JOINT_OUT [TEXT_ONLY_OUT]
"""
import json
import sys

NAMES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot"]


def records(out):
    with open(out + "/metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def last_eval(recs):
    ev = [r for r in recs if r.get("type") == "eval"]
    return ev[-1] if ev else None


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    joint = sys.argv[1]
    with open(joint + "/vision_eval.json") as f:
        ve = json.load(f)
    print("| task | examples | with the image | image = zeros | another image | chance |")
    print("|---|---|---|---|---|---|")
    chance = {"fashion": "10 %", "scenes": "25-50 % by type", "arithmetic": "about 1 %"}
    for task, t in ve.items():
        print(f"| {task} | {t['image']['examples']} | {100 * t['image']['accuracy']:.1f} % | "
              f"{100 * t['zeros']['accuracy']:.1f} % | {100 * t['other_image']['accuracy']:.1f} % | {chance.get(task, '')} |")
    if "scenes" in ve:
        print("\n| scene question | examples | with the image | zeros | another image | chance |")
        print("|---|---|---|---|---|---|")
        for q, v in ve["scenes"]["image"]["by_question"].items():
            z = ve["scenes"]["zeros"]["by_question"][q]["accuracy"]
            o = ve["scenes"]["other_image"]["by_question"][q]["accuracy"]
            print(f"| {q} | {v['examples']} | {100 * v['accuracy']:.1f} % | {100 * z:.1f} % | {100 * o:.1f} % | "
                  f"{100 * v['chance']:.0f} % |")
    if "fashion" in ve:
        c = ve["fashion"]["confusion_predicted_by_true"]
        print("\nFashion-MNIST confusion (rows: true class, columns: predicted; 'other': not a class name)\n")
        print("| true \\ predicted | " + " | ".join(NAMES) + " | other |")
        print("|---" * 12 + "|")
        for t in range(10):
            print(f"| {NAMES[t]} | " + " | ".join(str(c[p][t]) for p in range(11)) + " |")
    recs = records(joint)
    steps = [r for r in recs if r.get("type") == "step"]
    sec = sum(r["seconds"] for r in steps)
    vis = sum(r.get("seconds_vision", 0) for r in steps)
    enc = sum(r.get("encoder_thread_seconds", 0) for r in steps)
    imgs = sum(r.get("encoder_images", 0) for r in steps)
    threads = next((r["threads"] for r in recs if r.get("type") == "start"), 1)
    print(f"\ntraining: {len(steps)} steps in {sec:.0f} s; image-text sequences {100 * vis / sec:.1f} % of the step time")
    if enc > 0:
        print(f"encoder forward + backward: {enc:.0f} thread-seconds for {imgs} images = {imgs / enc:.0f} images/s per "
              f"thread, {100 * enc / (threads * sec):.1f} % of the step's thread time ({threads} threads)")
    ej = last_eval(recs)
    if ej:
        print(f"held-out text, joint run: {ej['bpb']:.4f} bits/byte ({ej['loss']:.4f} nats/token) at step {ej['step']}")
    if len(sys.argv) == 3:
        et = last_eval(records(sys.argv[2]))
        if et:
            print(f"held-out text, text-only run: {et['bpb']:.4f} bits/byte ({et['loss']:.4f} nats/token) at step {et['step']}")
            if ej:
                print(f"joint - text-only: {ej['bpb'] - et['bpb']:+.4f} bits/byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
