"""The byte pumps and connection state: listeners, client and upstream connections, mute, principals."""
