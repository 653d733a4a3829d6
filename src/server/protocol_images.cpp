#include "server/protocol_images.h"

namespace kiln::server {

using nlohmann::json;

namespace {

ApiError text_only_model(const std::string& param) {
  return ApiError(400, "'" + param + "': this model does not accept images (it is text-only)", param, "",
                  "images_not_supported");
}

}  // namespace

json chat_content(const json& content, size_t message, const ApiLimits& lim, std::vector<ImageRef>& images) {
  const std::string param = "messages[" + std::to_string(message) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content;
  if (!content.is_array())
    throw bad_request("'" + param + "' must be a string or a list of content parts", param);
  std::string text;
  json parts = json::array();
  bool has_image = false;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string pp = param + "[" + std::to_string(k) + "]";
    const json* type =
        part.is_object() && part.contains("type") && part["type"].is_string() ? &part["type"] : nullptr;
    if (type && *type == "text" && part.contains("text") && part["text"].is_string()) {
      text += part["text"].get<std::string>();
      parts.push_back({{"type", "text"}, {"text", part["text"]}});
      continue;
    }
    if (type && *type == "image_url") {
      if (!lim.vision) throw text_only_model(pp);
      const json* iu = part.contains("image_url") ? &part["image_url"] : nullptr;
      const json* url = iu && iu->is_object() && iu->contains("url") ? &(*iu)["url"] : iu;
      if (!url || !url->is_string() || url->get_ref<const std::string&>().empty())
        throw bad_request("'" + pp + "' must be {\"type\": \"image_url\", \"image_url\": {\"url\": \"...\"}}",
                          pp + ".image_url.url");
      images.push_back({url->get<std::string>(), pp + ".image_url.url", false});
      parts.push_back(
          {{"type", "image_url"}, {"image_url", {{"url", "<image " + std::to_string(images.size()) + ">"}}}});
      has_image = true;
      continue;
    }
    if (type && (*type == "image" || *type == "input_image")) {
      if (!lim.vision) throw text_only_model(pp);
      throw bad_request(
          "'" + pp + "': send images as {\"type\": \"image_url\", \"image_url\": {\"url\": \"...\"}}", pp);
    }
    throw bad_request("'" + pp + "' must be a text part {\"type\": \"text\", \"text\": \"...\"}" +
                          std::string(lim.vision ? " or an image part {\"type\": \"image_url\", ...}" : "") +
                          "; other kinds are not supported",
                      pp);
  }
  // The template sees the url as a placeholder: the data itself (possibly megabytes of base64) is not its
  // business.
  if (has_image) return parts;
  return text;
}

std::vector<ImageRef> generate_image_refs(const json& body, const ApiLimits& lim) {
  auto it = body.find("image_data");
  if (it == body.end() || it->is_null()) return {};
  std::vector<ImageRef> out;
  auto add = [&](const json& v, const std::string& param) {
    if (!v.is_string() || v.get_ref<const std::string&>().empty())
      throw bad_request("'" + param + "' must be a non-empty string (a data: URL, an http(s) URL or base64)",
                        param);
    out.push_back({v.get<std::string>(), param, true});
  };
  if (it->is_string()) {
    add(*it, "image_data");
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], "image_data[" + std::to_string(i) + "]");
  } else {
    throw bad_request("'image_data' must be a string or a list of strings", "image_data");
  }
  if (!out.empty() && !lim.vision) throw text_only_model("image_data");
  return out;
}

void attach_images(GenSpec& g, const std::vector<ImageRef>& images, const ApiLimits& lim, const char* param) {
  if (!lim.vision) return;
  const VisionSetup& v = *lim.vision;
  const int pads = vision::count_image_pads(g.prompt, v.tokens);
  if (static_cast<size_t>(pads) != images.size())
    throw bad_request(
        std::string("'") + param + "' has " + std::to_string(pads) +
            " image placeholder(s) (<|vision_start|><|image_pad|><|vision_end|>) but the request carries " +
            std::to_string(images.size()) + " image(s)",
        param);
  if (images.empty()) return;
  g.images = load_images(images, v);
  try {
    g.prompt = vision::expand_image_pads(g.prompt, g.images, v.tokens, v.processor.merge_size);
  } catch (const kiln::Error& e) {
    throw bad_request(std::string("'") + param + "': " + e.what(), param);
  }
}

}  // namespace kiln::server
