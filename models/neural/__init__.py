"""The neural voices: Piper's VITS and HiFi-GAN in torch, read from a Piper voice
file (`voice_file`: its config, phoneme ids and weights), and the acoustic and
vocoder models the workers run (`piper`)."""
