// Catch2 main of the torch-free tier (formats, tuner, reports).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
