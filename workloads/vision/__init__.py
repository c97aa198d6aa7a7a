"""Image classifiers: a convolutional network (ResNet) and a vision transformer (ViT)."""
