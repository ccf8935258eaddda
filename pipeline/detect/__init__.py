"""Detection transfer of a pretrained backbone: export to detectron2's layout, and (jobs/detect.py) fine-tuning
on detectron2's or torchvision's detectors."""
