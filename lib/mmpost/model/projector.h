// LLaVA multimodal projector (HF LlavaMultiModalProjector): linear_1 -> act -> linear_2, mapping
// vision features [N, P, C_vision] to the text model's width [N, P, C_text].
#pragma once

#include "mmpost/model/blocks.h"
#include "mmpost/model/config.h"

#include <torch/torch.h>

#include "mmpost/model/lora.h"

namespace mmpost::model {

/// linear_2(act(linear_1(x))); biases per `multimodal_projector_bias`.
class ProjectorImpl : public torch::nn::Module {
 public:
  explicit ProjectorImpl(const VlmConfig& c);
  /// x: [N, P, C_vision] -> [N, P, C_text].
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear linear_1{nullptr}, linear_2{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(Projector);

}  // namespace mmpost::model
