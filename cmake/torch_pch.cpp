// Anchor translation unit for the shared torch precompiled header (cmake/VlatuneTorch.cmake).
