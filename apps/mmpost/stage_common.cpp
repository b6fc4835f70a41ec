// Shared stage glue (see stage_common.h).
#include "mmpost/stage_common.h"

#include "mmpost/train/shards.h"

#include "mmpost/io/safetensors.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "mmpost/core/check.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/hub/qwen2_vl_folder.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os << std::setprecision(prec) << v;
  return os.str();
}

void freeze_parts(model::Vlm& m, const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    for (auto* mod : model::model_part(*m, part)) {
      for (auto& p : mod->parameters()) p.set_requires_grad(false);
    }
  }
}

int64_t count_params(const model::Vlm& m, bool trainable_only) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) {
    if (!trainable_only || p.requires_grad()) n += p.numel();
  }
  return n;
}

data::LoaderOptions train_loader_options(const config::CommonConfig& cfg,
                                         const dist::WorldInfo& world) {
  data::LoaderOptions lo;
  lo.rank = world.rank;
  lo.world_size = world.world_size;
  lo.path = cfg.data.train;
  lo.batch_size = cfg.train.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.shuffle_buffer = cfg.data.shuffle_buffer;
  lo.prefetch = cfg.data.prefetch;
  lo.seed = static_cast<uint64_t>(cfg.seed);
  lo.skip_bad = cfg.data.on_bad_sample == "skip";
  lo.repeat = true;
  // Samples repeat exactly across epochs unless augmented (the stage turns it off for mDPO).
  if (cfg.data.image.random_shift == 0) {
    lo.cache_bytes = static_cast<int64_t>(cfg.data.cache_gb * 1e9);
  }
  lo.preload = cfg.data.preload;
  return lo;
}

DataParallelContext join_process_group(const std::string& device, double timeout_s,
                                       const std::string& command) {
  DataParallelContext c;
  try {
    c.world = dist::world_from_env();
  } catch (const std::runtime_error& e) {
    throw Error(ErrorKind::kUsage, command + ": " + e.what(),
                "launch with torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun");
  }
  set_log_rank(c.world.rank, c.world.world_size);
  c.device = resolve_device(device);
  if (c.world.world_size == 1) return c;
  if (c.device.is_cuda() && !c.device.has_index()) {
    c.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(c.world.local_rank));
  }
  log_info(command + ": joining " + std::to_string(c.world.world_size) + " processes (" +
           c.world.launcher + ")");
  c.pg = std::make_unique<dist::ProcessGroup>(c.world, timeout_s,
                                              c.device.is_cuda() ? "nccl" : "gloo");
  return c;
}

int64_t pad_id_of(const data::Tokenizer& tok) {
  return tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();
}

namespace {
std::string gb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}
}  // namespace

void check_memory_fits(const model::VlmConfig& c, const config::ModelSection& m,
                       const torch::Device& device, torch::Dtype dtype, const std::string& what,
                       int64_t available_host) {
  const auto n = model::param_counts(c);
  int64_t trainable = n.total();
  for (const auto& part : m.freeze) {
    if (part == "vision_tower") trainable -= n.vision_tower;
    if (part == "projector") trainable -= n.projector;
    if (part == "language_model") trainable -= n.language_model;
  }
  const int64_t wb = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t state = model::training_state_bytes(n.total(), trainable, wb);
  // Built in float32 on the host first, then converted and moved.
  const int64_t host = device.is_cpu() ? std::max(state, n.total() * 4) : n.total() * 4;
  const std::string sizes =
      what + " describes " + std::to_string(n.total()) + " parameters (vision_tower " +
      std::to_string(n.vision_tower) + ", projector " + std::to_string(n.projector) +
      ", language_model " + std::to_string(n.language_model) + "; " + std::to_string(trainable) +
      " trainable): training in " + dtype_name(dtype) + " holds about " + gb(state) +
      " (weights " + gb(n.total() * wb) + ", gradients and AdamW moments " +
      gb(trainable * 3 * wb) + ") before activations";
  const std::string hint =
      "\n  hint: check the config's sizes (an empty text_config or vision_config takes "
      "transformers' LLaVA-7B defaults), freeze parts (model.freeze), or raise model.max_memory_gb";
  if (m.max_memory_gb > 0) {
    MMPOST_CHECK_USAGE(static_cast<double>(state) <= m.max_memory_gb * 1e9, sizes,
                       ", over model.max_memory_gb = ", m.max_memory_gb, hint);
  }
  if (available_host >= 0) {
    MMPOST_CHECK_USAGE(host <= available_host, sizes, ", but ", gb(available_host),
                       " of host memory is available", hint);
  }
}

namespace {
/// The model section as check_memory_fits should see it: under LoRA only modules_to_save hold
/// gradients and AdamW moments (the adapters are ~1 % and left out), so the rest counts as frozen.
config::ModelSection memory_view(const config::ModelSection& m, const config::LoraSection& lora) {
  if (lora.r <= 0) return m;
  config::ModelSection v = m;
  v.freeze.clear();
  auto saved = [&](const std::string& part) {
    return std::find(lora.modules_to_save.begin(), lora.modules_to_save.end(), part) !=
           lora.modules_to_save.end();
  };
  if (!saved("vision_tower")) v.freeze.push_back("vision_tower");
  if (!saved("multi_modal_projector")) v.freeze.push_back("projector");
  if (!saved("language_model")) v.freeze.push_back("language_model");
  return v;
}
/// A run resumes with the LoRA settings it was trained with (an adapter on or off, r, alpha,
/// rsLoRA, dropout and targets change what the saved state means). Throws Error(kUsage) naming
/// the setting and both values.
void check_lora_resume(const fs::path& ckpt, const config::LoraSection& lora) {
  const bool had = hub::has_lora_adapter(ckpt);
  const std::string hint =
      "\n  hint: resume with the run's own settings (recipe.json in the output folder), or "
      "start over with --no-resume";
  MMPOST_CHECK_USAGE(had == (lora.r > 0), ckpt.string(), ": this run was trained ",
                     had ? "with LoRA (adapter_config.json)" : "without LoRA", ", but lora.r is ",
                     lora.r, hint);
  if (!had) return;
  const auto saved = hub::read_lora_settings(ckpt);
  auto same = [&](const std::string& key, const std::string& was, const std::string& now) {
    MMPOST_CHECK_USAGE(was == now, "lora.", key, ": ", now, ", but ", ckpt.string(),
                       " was trained with ", was, hint);
  };
  same("r", std::to_string(saved.r), std::to_string(lora.r));
  same("alpha", fmt(saved.lora_alpha), fmt(lora.alpha));
  same("use_rslora", saved.use_rslora ? "true" : "false", lora.use_rslora ? "true" : "false");
  same("dropout", fmt(saved.lora_dropout), fmt(lora.dropout));
  const nlohmann::json saved_targets =
      saved.target_regex.empty() ? nlohmann::json(saved.target_modules) : nlohmann::json(saved.target_regex);
  same("target_modules", saved_targets.dump(), lora.target_modules.dump());
  // adapter_config.json lists the parts (plus lm_head beside language_model when untied).
  const auto cfg = hub::read_json(ckpt / "adapter_config.json");
  std::vector<std::string> was;
  if (cfg.contains("modules_to_save") && cfg["modules_to_save"].is_array()) {
    for (const auto& v : cfg["modules_to_save"]) {
      if (v.is_string() && v != "lm_head") was.push_back(v.get<std::string>());
    }
  }
  same("modules_to_save", nlohmann::json(was).dump(), nlohmann::json(lora.modules_to_save).dump());
}

}  // namespace

StageModel load_stage_model(const config::ModelSection& m, const config::ImageSection& img,
                            const std::optional<fs::path>& ckpt, const torch::Device& device,
                            torch::Dtype dtype, const std::string& stage,
                            const config::LoraSection& lora) {
  StageModel sm;
  sm.tokenizer_path = m.tokenizer;
  sm.image.resize_mode = img.resize_mode;
  sm.image.interpolation = img.interpolation;
  sm.image.image_mean = img.image_mean;
  sm.image.image_std = img.image_std;
  if (ckpt || !m.path.empty()) {
    sm.source = ckpt ? *ckpt : fs::path(m.path);
    log_info(stage + ": loading model from " + sm.source.string());
    const bool qwen = hub::is_qwen2_vl_folder(sm.source);
    for (const auto& part : lora.modules_to_save) {
      MMPOST_CHECK_USAGE(!qwen || part == "language_model", "lora.modules_to_save: \"", part,
                         "\" is a LLaVA part; on a Qwen2-VL family model (", sm.source.string(),
                         ") only \"language_model\" can be trained whole beside the adapters",
                         "\n  hint: target the vision tower's layers with lora.target_modules "
                         "(e.g. a regex over \"model.visual.blocks...\")");
    }
    // LLaVA: the size is checked from config.json before anything is allocated.
    if (!qwen) {
      check_memory_fits(hub::read_model_config(sm.source), memory_view(m, lora), device, dtype,
                        (sm.source / "config.json").string(), available_host_memory_bytes());
    }
    if (ckpt) check_lora_resume(*ckpt, lora);
    // Resuming a LoRA run: the checkpoint's adapter goes into the new adapters below, unmerged.
    auto p = hub::load_pretrained(sm.source, /*merge_adapter=*/!(ckpt && lora.r > 0));
    sm.model = p.model;
    if (sm.tokenizer_path.empty() || ckpt) sm.tokenizer_path = p.tokenizer_path;
    if (p.has_processor_config) {
      // The folder's processor is what the model was trained with, and wins; a recipe value
      // set away from the default and different from it is named, not silently dropped.
      const config::ImageSection d;
      auto note = [&](const std::string& key, bool set, bool differs) {
        if (set && differs) {
          log_warn("data.image." + key + ": the recipe's value is not used: " +
                   sm.source.string() + "'s processor config sets it (the model's preprocessing)");
        }
      };
      note("resize_mode", img.resize_mode != d.resize_mode, img.resize_mode != p.image.resize_mode);
      note("interpolation", img.interpolation != d.interpolation,
           img.interpolation != p.image.interpolation);
      note("image_mean", img.image_mean != d.image_mean, img.image_mean != p.image.image_mean);
      note("image_std", img.image_std != d.image_std, img.image_std != p.image.image_std);
      sm.image = p.image;
    }
    sm.image.qwen = p.image.qwen;
  } else {
    const auto c = model::vlm_config_from_json(m.config, "model.config");
    check_memory_fits(c, memory_view(m, lora), device, dtype, "model.config",
                      available_host_memory_bytes());
    sm.model = model::build_vlm(c);  // seeded by the caller
  }
  const auto& mcfg = sm.model->config();
  sm.image.image_size = mcfg.vision_config.image_size;
  sm.image.max_pixels = img.max_pixels;  // the recipe's, whatever the checkpoint's processor says
  static_assert(config::ImageSection{}.max_pixels == data::kDefaultMaxPixels);
  MMPOST_CHECK_USAGE(!sm.tokenizer_path.empty(),
                     "model.tokenizer: no tokenizer.model or tokenizer.json found",
                     "\n  hint: set model.tokenizer to a sentencepiece model or a tokenizer.json");
  sm.tokenizer = load_folder_tokenizer(*sm.model, sm.tokenizer_path, sm.source.string());
  if (!sm.tokenizer->normalizer_note().empty()) {
    log_warn(sm.tokenizer_path.string() + ": " + sm.tokenizer->normalizer_note());
  }
  MMPOST_CHECK_USAGE(sm.tokenizer->vocab_size() <= mcfg.text_config.vocab_size, "tokenizer ",
                     sm.tokenizer_path.string(), " has ", sm.tokenizer->vocab_size(),
                     " ids but text_config.vocab_size is ", mcfg.text_config.vocab_size);
  freeze_parts(sm.model, m.freeze);
  sm.model->to(device, dtype);
  sm.model->train();
  sm.model->set_activation_checkpointing(m.enable_activation_checkpointing);
  if (lora.r > 0) {
    for (auto& p : sm.model->parameters()) p.set_requires_grad(false);
    for (const auto& part : lora.modules_to_save) {
      auto* module = part == "vision_tower" ? static_cast<torch::nn::Module*>(sm.model->vision_tower.get())
                     : part == "multi_modal_projector"
                         ? static_cast<torch::nn::Module*>(sm.model->multi_modal_projector.get())
                         : static_cast<torch::nn::Module*>(sm.model->language_model.get());
      for (auto& p : module->parameters()) p.set_requires_grad(true);
    }
    model::LoraSettings s;
    s.r = lora.r;
    s.lora_alpha = lora.alpha;
    s.lora_dropout = lora.dropout;
    s.use_rslora = lora.use_rslora;
    if (lora.target_modules.is_string()) {
      s.target_regex = lora.target_modules.get<std::string>();
    } else {
      s.target_modules = lora.target_modules.get<std::vector<std::string>>();
    }
    sm.lora = std::make_unique<model::LoraAdapters>(*sm.model, s);
    // PEFT wraps a modules_to_save part whole and ignores adapters inside it: refuse the mix.
    for (const auto& part : lora.modules_to_save) {
      const std::string prefix = part == "language_model" ? "model.language_model."
                                 : part == "vision_tower" ? "model.vision_tower."
                                                          : "model.multi_modal_projector.";
      for (const auto& name : sm.lora->target_names()) {
        MMPOST_CHECK_USAGE(name.rfind(prefix, 0) != 0, "lora.modules_to_save: ", part,
                           " is trained whole, but lora.target_modules also puts an adapter in it (",
                           name, "); PEFT would load that adapter's part wrong",
                           "\n  hint: target only the other parts with a regex, e.g. "
                           "\".*language_model.*\\\\.(q_proj|k_proj|v_proj|o_proj)\"");
      }
    }
    if (ckpt && hub::has_lora_adapter(*ckpt)) {
      const auto file = *ckpt / "adapter_model.safetensors";
      sm.lora->load(io::load_safetensors(file), file.string());
    }
    int64_t n_adapter = 0;
    for (const auto& [k, t] : sm.lora->named_parameters()) n_adapter += t.numel();
    log_info(stage + ": LoRA r=" + std::to_string(lora.r) + " alpha=" + fmt(lora.alpha) + " on " +
             std::to_string(sm.lora->size()) + " linear layers: " + std::to_string(n_adapter) +
             " adapter parameters + " + std::to_string(count_params(sm.model, true)) +
             " in modules_to_save trainable; the base model is frozen");
  }
  int64_t n_trainable = count_params(sm.model, true);
  if (sm.lora) {
    for (const auto& [k, t] : sm.lora->named_parameters()) n_trainable += t.numel();
  }
  log_info(stage + ": model " + std::to_string(count_params(sm.model, false)) + " parameters, " +
           std::to_string(n_trainable) + " trainable" + (sm.lora ? " (LoRA adapters included)" : "") +
           "; " +
           describe_device(device) + ", " + dtype_name(dtype));
  return sm;
}

data::SampleContext make_sample_context(const StageModel& sm, const config::DataSection& data,
                                        const std::string& path) {
  const auto& mcfg = sm.model->config();
  data::SampleContext ctx;
  ctx.tokenizer = sm.tokenizer.get();
  ctx.template_options = template_options_for(*sm.model, *sm.tokenizer, data.chat_template, false);
  ctx.image = sm.image;
  ctx.base_dir = fs::path(path).parent_path();
  ctx.source = path;
  ctx.max_length = data.max_length;
  return ctx;
}

data::TemplateOptions template_options_for(const model::VlmImpl& m, const data::Tokenizer& tok,
                                           const std::string& chat_template,
                                           bool add_generation_prompt) {
  const bool qwen = m.is_qwen2_vl();
  data::TemplateOptions o;
  // A Qwen2-VL folder whose tokenizer carries no chat template is still a Qwen2-VL model.
  o.chat_template = qwen && chat_template == "auto" && tok.chat_template().empty()
                        ? data::ChatTemplate::kQwen2Vl
                        : data::resolve_chat_template(chat_template, tok);
  o.image_token_id = m.config().image_token_index;
  o.n_image_tokens = qwen ? 0 : m.config().n_image_tokens();
  if (qwen) o.image_text = "<|image_pad|>";
  o.add_generation_prompt = add_generation_prompt;
  return o;
}

std::unique_ptr<data::Tokenizer> load_folder_tokenizer(const model::VlmImpl& m,
                                                       const fs::path& tokenizer_path,
                                                       const std::string& dir) {
  MMPOST_CHECK_USAGE(!tokenizer_path.empty(), dir,
                     ": no tokenizer.model or tokenizer.json in the folder",
                     "\n  hint: set model.tokenizer to a sentencepiece model or a tokenizer.json");
  // The files beside it (tokenizer_config.json, tokenizer.json's added tokens, the chat
  // template) belong to it, e.g. llava-hf's <image> 32000, SmolLM2's <|im_end|> EOS.
  auto tok = hub::load_tokenizer(tokenizer_path);
  // LLaVA's <image> is a token of its own; the Qwen2-VL family's template writes
  // <|image_pad|>, which its tokenizer already has.
  if (!m.is_qwen2_vl()) tok->add_special_token(data::kImagePlaceholder, m.config().image_token_index);
  return tok;
}

std::vector<std::pair<std::string, torch::Tensor>> trainable_named(const StageModel& sm) {
  model::Vlm m = sm.model;  // a handle to the same module (non-const)
  auto named = train::named_parameters_of(*m);
  if (sm.lora) {
    for (auto& kv : sm.lora->named_parameters()) named.push_back(kv);
  }
  return named;
}

std::vector<torch::Tensor> trainable_tensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<torch::Tensor> out;
  for (const auto& kv : named) {
    if (kv.second.requires_grad()) out.push_back(kv.second);
  }
  return out;
}

int64_t stage_cpu_shards(int64_t requested, const std::vector<torch::Tensor>& trainable,
                         const train::Run& run, double lora_dropout,
                         const std::string& stage_blocker, const std::string& stage) {
  std::string blocker = train::shard_blocker(lora_dropout, run.dtype(), run.mixed_precision(),
                                             run.world().world_size);
  if (blocker.empty()) blocker = stage_blocker;
  int64_t bytes = 0;
  for (const auto& t : trainable) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  const int64_t n = train::resolve_cpu_shards(requested, run.device(), bytes, blocker);
  if (n > 1) {
    log_info(stage + ": train.cpu_shards " + std::to_string(n) + (requested == 0 ? " (auto)" : "") +
             ": each micro-batch runs as " + std::to_string(n) +
             " row shards at once, one per thread");
  }
  return n;
}

StageReference load_reference(StageModel& sm, const config::LoraSection& lora,
                              const fs::path& src, const std::string& own_copy_reason,
                              const torch::Device& device, torch::Dtype dtype,
                              const std::string& stage) {
  StageReference ref;
  if (sm.lora && own_copy_reason.empty() && lora.modules_to_save.empty()) {
    log_info(stage + ": reference model = the policy with its LoRA adapters off (no copy)");
    ref.model = sm.model;
    ref.adapters_off = sm.lora.get();
    return ref;
  }
  std::string why;
  if (sm.lora) {
    why = !own_copy_reason.empty() ? "; a copy, as " + own_copy_reason + " asks"
                                   : "; a copy, since lora.modules_to_save trains whole parts";
  }
  log_info(stage + ": reference model from " + src.string() + " (" + dtype_name(dtype) + why + ")");
  ref.model = hub::load_pretrained(src).model;
  MMPOST_CHECK_USAGE(ref.model->is_qwen2_vl() == sm.model->is_qwen2_vl(), src.string(),
                     ": the reference model is ", ref.model->is_qwen2_vl() ? "a Qwen2-VL family"
                     : "a LLaVA-style", " model but the policy is not (both must read the same "
                     "inputs)");
  MMPOST_CHECK_USAGE(ref.model->config().text_config.vocab_size ==
                         sm.model->config().text_config.vocab_size,
                     src.string(), ": the reference model's vocabulary size differs from the policy's");
  ref.model->to(device, dtype);
  ref.model->eval();
  for (auto& p : ref.model->parameters()) p.set_requires_grad(false);
  return ref;
}

}  // namespace mmpost::cli
