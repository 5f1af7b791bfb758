#pragma once
// The loss scaler's state as Python's torch.amp.GradScaler.state_dict() holds it (torch-free, so
// that ddp/checkpoint/checkpoint.h can carry it in TrainingProgress without the scaler's header).
#include <cstdint>

namespace ddp::amp {

// Python's keys: "scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker".
struct GradScalerState {
  double scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;  // "_growth_tracker": consecutive steps without inf/NaN
};

}  // namespace ddp::amp
