"""GRPO for diffusion models (lessons 08–09): digits data, a class-conditional diffusers UNet, DDPM.

The "prompt" of an image is its digit class; the base model is a tiny ``UNet2DModel`` trained with a
``DDPMScheduler`` on scikit-learn's bundled 8×8 digits, upsampled to 16×16. Nothing is downloaded.
"""
